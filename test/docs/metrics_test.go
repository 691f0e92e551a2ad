package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestMetricsDocListsEveryMetric: docs/metrics.md has a row for every metric the code registers (a Name: or
// NewDesc of a non-test file), and every metric it has a row for is registered somewhere.
func TestMetricsDocListsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	// Names as the code spells them: Name: "x" (with Subsystem: "provider" before it on the same line), or
	// prometheus.NewDesc("x", ...).
	named := regexp.MustCompile(`(?:Subsystem: "([a-z_]+)", )?Name: +"([a-z_]+)"|NewDesc\("([a-z_]+)"`)
	registered := map[string]string{}
	goSources(t, func(path string) bool { return !strings.HasSuffix(path, "_test.go") }, func(path, src string) {
		if !strings.Contains(src, "prometheus.") {
			return
		}
		for _, m := range named.FindAllStringSubmatch(src, -1) {
			name := m[2] + m[3]
			if m[1] != "" {
				name = m[1] + "_" + name
			}
			if strings.HasPrefix(name, "faas_gpu_") || strings.HasPrefix(name, "provider_") ||
				strings.HasPrefix(name, "gateway_") {
				registered[name] = path
			}
		}
	})
	if len(registered) < 30 {
		t.Fatalf("found only %d metrics in the code: %v", len(registered), registered)
	}
	for name, path := range registered {
		if !documented[name] {
			t.Errorf("%s registers %s, which docs/metrics.md does not list", path, name)
		}
	}
	for name := range documented {
		if _, ok := registered[name]; !ok {
			t.Errorf("docs/metrics.md lists %s, which no code registers", name)
		}
	}
}
