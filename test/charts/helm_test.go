// Package charts checks the Helm charts and image files: helm lint, helm template with several value sets, every
// rendered object decoded strictly with client-go's scheme plus Knative's (an unknown or misspelt field fails),
// golden files of the default rendering, and the values overlay for the stock openfaas chart.
package charts

import (
	"bytes"
	"flag"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

const (
	chartDir   = "../../charts/faas-gpu"
	overlay    = "../../charts/openfaas-overlay/values.yaml"
	standin    = "testdata/openfaas-standin"
	goldenFile = "testdata/faas-gpu-default.golden.yaml"
)

// helmBinary finds helm: $FAAS_GPU_HELM (make test sets it to the pinned helm it builds into the cache, and then
// a missing or broken helm fails the test), else helm on PATH or in $GOPATH/bin, else the test is skipped (a bare
// `go test`), unless CI=true.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FAAS_GPU_HELM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("FAAS_GPU_HELM: %v (make helm builds it)", err)
		}
		return p
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	for _, dir := range filepath.SplitList(build.Default.GOPATH) {
		p := filepath.Join(dir, "bin", "helm")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	msg := "helm not found (FAAS_GPU_HELM, PATH, $GOPATH/bin): `make test` builds the pinned one (make helm)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}

// object is one rendered manifest, decoded strictly.
type object struct {
	Kind, Name, Namespace string
	Obj                   runtime.Object // nil for kinds outside the schemes (ServiceMonitor), checked separately
	Raw                   []byte
}

func newDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := servingv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// decodeAll splits a rendering into documents and decodes each strictly.
func decodeAll(t *testing.T, rendered []byte) []object {
	t.Helper()
	dec := newDecoder(t)
	var out []object
	for _, doc := range docSeparator.Split(string(rendered), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		o := object{Kind: meta.Kind, Name: meta.Metadata.Name, Namespace: meta.Metadata.Namespace, Raw: []byte(doc)}
		if meta.Kind == "ServiceMonitor" {
			var sm serviceMonitor
			if err := yaml.UnmarshalStrict([]byte(doc), &sm); err != nil {
				t.Errorf("ServiceMonitor %s: %v", o.Name, err)
			}
		} else {
			obj, _, err := dec.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Errorf("%s %s does not decode strictly: %v\n%s", meta.Kind, o.Name, err, doc)
				continue
			}
			o.Obj = obj
		}
		out = append(out, o)
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the chart uses (the Prometheus Operator's
// types are not a dependency); strict decoding still catches a misspelt field.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

func render(t *testing.T, sets ...string) []byte {
	t.Helper()
	args := []string{"template", "faas-gpu", chartDir, "--namespace", "faas-gpu"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return helm(t, args...)
}

func TestLint(t *testing.T) {
	helm(t, "lint", "--strict", chartDir)
	helm(t, "lint", "--strict", chartDir, "--set", "provider.enabled=true,provider.backend=knative,serviceMonitor.enabled=true")
	helm(t, "lint", "--strict", standin, "-f", overlay)
}

// generated matches values the chart generates at random (the NATS password, the gpuservers' key, the provider's
// basic-auth password), masked in the golden comparison.
var generated = regexp.MustCompile(`(?m)^(\s*(?:nats-password|gpuserver\.key|basic-auth-password): )"[A-Za-z0-9]+"$`)

func TestGolden(t *testing.T) {
	got := render(t)
	decodeAll(t, got)
	got = generated.ReplaceAll(got, []byte(`${1}"(random)"`))
	if *update {
		if err := os.WriteFile(goldenFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("%v (run go test ./test/charts -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the default rendering differs from %s; review and run go test ./test/charts -update\n%s",
			goldenFile, lineDiff(string(want), string(got)))
	}
}

// lineDiff shows the first lines that differ.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  golden:   %q\n  rendered: %q", i+1, wl, gl)
		}
	}
	return ""
}

func TestValueSetsDecodeStrictly(t *testing.T) {
	sets := map[string][]string{
		"standalone kubernetes":    {"provider.enabled=true", "provider.clusterRole=true"},
		"standalone knative":       {"provider.enabled=true", "provider.backend=knative", "swapIn.knative=true"},
		"hostPath devices":         {"gpuserver.deviceAccess=hostPath", "serviceMonitor.enabled=true"},
		"external nats":            {"nats.enabled=false", "nats.external.url=nats://nats.messaging:4222"},
		"no queue worker":          {"queueWorker.enabled=false", "swapIn.enabled=false", "gpuserver.metricsPort=0"},
		"simulated node, no taint": {"gpuserver.gpus=h100x8", "gpuNodes.toleration="},
	}
	for name, s := range sets {
		t.Run(name, func(t *testing.T) {
			objs := decodeAll(t, render(t, s...))
			if len(objs) == 0 {
				t.Fatal("nothing rendered")
			}
		})
	}
}

func TestBadValuesFail(t *testing.T) {
	helmBinary(t)
	for _, s := range [][]string{
		{"gpuserver.deviceAccess=cdi"},
		{"provider.enabled=true", "provider.backend=nomad"},
		{"nats.enabled=false"},
	} {
		args := []string{"template", "x", chartDir}
		for _, v := range s {
			args = append(args, "--set", v)
		}
		if out, err := exec.Command(helmBinary(t), args...).CombinedOutput(); err == nil {
			t.Errorf("%v rendered without error:\n%s", s, out)
		}
	}
}

// TestStrictDecoderRejectsTypos proves the decoder the chart tests use fails on a misspelt field.
func TestStrictDecoderRejectsTypos(t *testing.T) {
	dec := newDecoder(t)
	good := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicas: 1\n"
	if _, _, err := dec.Decode([]byte(good), nil, nil); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		strings.Replace(good, "replicas", "replica", 1),
		"apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containerz: []\n",
	} {
		if _, _, err := dec.Decode([]byte(bad), nil, nil); err == nil {
			t.Errorf("strict decoding accepted:\n%s", bad)
		}
	}
	var sm serviceMonitor
	if err := yaml.UnmarshalStrict([]byte("spec:\n  endpoint: []\n"), &sm); err == nil {
		t.Error("ServiceMonitor typo accepted")
	}
}
