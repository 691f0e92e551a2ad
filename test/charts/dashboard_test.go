package charts

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestGrafanaDashboard: with grafanaDashboard.enabled the chart renders one ConfigMap that Grafana's dashboard
// sidecar picks up (the label grafana_dashboard: "1", its folder annotation) holding a dashboard that decodes, has
// its panels' queries on the Prometheus data source variable, and queries only metrics faas-gpu exports
// (docs/metrics.md, which test/docs pins to the code), each of them at least once among the pool, SLO, refusal,
// queue and bill metrics. Off by default.
func TestGrafanaDashboard(t *testing.T) {
	for _, o := range decodeAll(t, render(t)) {
		if strings.HasSuffix(o.Name, "-grafana-dashboard") {
			t.Fatalf("the default rendering has the dashboard ConfigMap %s; it is opt-in", o.Name)
		}
	}
	var cms []*corev1.ConfigMap
	for _, o := range decodeAll(t, render(t, "grafanaDashboard.enabled=true", "grafanaDashboard.namespace=monitoring")) {
		if cm, ok := o.Obj.(*corev1.ConfigMap); ok && strings.HasSuffix(cm.Name, "-grafana-dashboard") {
			cms = append(cms, cm)
		}
	}
	if len(cms) != 1 {
		t.Fatalf("%d dashboard ConfigMaps, want 1", len(cms))
	}
	cm := cms[0]
	if cm.Labels["grafana_dashboard"] != "1" || cm.Namespace != "monitoring" || cm.Annotations["grafana_folder"] != "faas-gpu" {
		t.Fatalf("ConfigMap %s/%s labels %v annotations %v: want grafana_dashboard=1 and the folder", cm.Namespace,
			cm.Name, cm.Labels, cm.Annotations)
	}
	raw, ok := cm.Data["faas-gpu.json"]
	if !ok {
		t.Fatalf("the ConfigMap has no faas-gpu.json: %v", cm.Data)
	}
	file, err := os.ReadFile(chartDir + "/dashboards/faas-gpu.json")
	if err != nil || strings.TrimSpace(string(file)) != strings.TrimSpace(raw) {
		t.Fatalf("the ConfigMap does not hold dashboards/faas-gpu.json as it is (%v)", err)
	}
	var dash struct {
		Title, UID string
		Panels     []struct {
			Type, Title string
			Datasource  *struct{ Type, UID string }
			Targets     []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Name, Type, Query any }
		}
	}
	if err := json.Unmarshal([]byte(raw), &dash); err != nil || dash.UID != "faas-gpu" {
		t.Fatalf("the dashboard does not decode: %v", err)
	}
	hasDatasource := false
	for _, v := range dash.Templating.List {
		hasDatasource = hasDatasource || v.Name == "datasource" && v.Type == "datasource"
	}
	if !hasDatasource {
		t.Error("the dashboard has no Prometheus data source variable")
	}

	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		exported[m[1]] = true
	}
	used := map[string]bool{}
	metric := regexp.MustCompile(`\b((?:faas_gpu|provider|gateway)_[a-z_]+)`)
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: no query on the data source variable", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range metric.FindAllString(tg.Expr, -1) {
				name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !exported[name] {
					t.Errorf("panel %q queries %s, which faas-gpu does not export (docs/metrics.md)", p.Title, m)
				}
				used[name] = true
			}
		}
	}
	for _, want := range []string{"faas_gpu_gpu_busy", "faas_gpu_gpu_memory_used_bytes", "faas_gpu_on_time_requests_total",
		"faas_gpu_acquire_total", "faas_gpu_queue_depth", "faas_gpu_usage_gpu_seconds_total",
		"faas_gpu_usage_host_memory_byte_seconds_total"} {
		if !used[want] {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}
