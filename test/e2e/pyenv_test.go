package e2e

// The real-CUDA tier (make test-cuda): tests with PyEnv in their name use NVIDIA's CUDA 13 libraries and PyTorch
// from the pinned environment of test/pyenv (pyenv.Require), and skip outside that tier. No GPU is needed.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/local"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// pyEnv returns the pinned Python environment's directory, or skips outside `make test-cuda`.
func pyEnv(t *testing.T) string {
	t.Helper()
	return pyenv.Require(t)
}

// handlerReply is one answer of a handler: its status and JSON body.
type handlerReply struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// handlerDriver imports functions/<fn>/handler.py and answers one JSON request per input line, as the gpu-python
// template would call handle().
const handlerDriver = `import json, sys
import handler
class Event:
    def __init__(self, body):
        self.body, self.headers, self.method, self.query, self.path = body, {}, "POST", {}, "/"
for line in sys.stdin:
    r = handler.handle(Event(line.rstrip("\n").encode()), None)
    print(json.dumps({"status": r["statusCode"], "body": r["body"]}, allow_nan=False), flush=True)
`

// runHandler runs a function's handler on the CPU with the pinned environment's python, one process for all
// requests, and returns the answers in order.
func runHandler(t *testing.T, py, fn string, requests []string) []handlerReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // a generous bound on a loaded CPU
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(py, "bin", "python3"), "-c", handlerDriver)
	cmd.Dir = filepath.Join(repoRoot(t), "functions", fn)
	cmd.Env = append(os.Environ(), "TORCH_DEVICE=cpu", "FAAS_GPU=", "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stdin = strings.NewReader(strings.Join(requests, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s handler: %v\n%s", fn, err, stderr.String())
	}
	var replies []handlerReply
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var r handlerReply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s handler answered %.200q: %v", fn, sc.Text(), err)
		}
		replies = append(replies, r)
	}
	if len(replies) != len(requests) {
		t.Fatalf("%s handler answered %d of %d requests\n%s", fn, len(replies), len(requests), stderr.String())
	}
	return replies
}

func decode[T any](t *testing.T, what string, r handlerReply) T {
	t.Helper()
	var v T
	if r.Status != http.StatusOK {
		t.Fatalf("%s: status %d %s", what, r.Status, r.Body)
	}
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("%s: %v: %.300s", what, err, r.Body)
	}
	return v
}

type summaryJSON struct {
	Shape     []int    `json:"shape"`
	Mean      *float64 `json:"mean"`
	Std       *float64 `json:"std"`
	Nonfinite int      `json:"nonfinite"`
}

type resnetAnswer struct {
	Model  string `json:"model"`
	Device string `json:"device"`
	Batch  int    `json:"batch"`
	Input  string `json:"input"`
	TopK   [][]struct {
		Class       int      `json:"class"`
		Label       string   `json:"label"`
		Logit       *float64 `json:"logit"`
		Probability *float64 `json:"probability"`
	} `json:"top_k"`
	Summary summaryJSON `json:"logits_summary"`
	Logits  [][]float64 `json:"logits"`
}

type bertAnswer struct {
	Model    string  `json:"model"`
	Device   string  `json:"device"`
	Batch    int     `json:"batch"`
	SeqLen   int     `json:"seq_len"`
	Input    string  `json:"input"`
	InputIDs [][]int `json:"input_ids"`
	Pooled   struct {
		summaryJSON
		Norm []*float64 `json:"norm"`
		Head []*float64 `json:"head"`
	} `json:"pooled"`
	Hidden    summaryJSON `json:"last_hidden_state"`
	Embedding [][]float64 `json:"embedding"`
}

// close reports whether a and b agree within a tolerance relative to the larger magnitude (float32 rounding of
// different batch shapes on the CPU).
func closeTo(a, b []float64, rel float64) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	scale := 0.0
	for i := range a {
		scale = math.Max(scale, math.Max(math.Abs(a[i]), math.Abs(b[i])))
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > rel*scale {
			return false
		}
	}
	return true
}

func pngBase64(t *testing.T) string {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 300, 200))
	for y := 0; y < 200; y++ {
		for x := 0; x < 300; x++ {
			img.Set(x, y, color.RGBA{uint8(x), uint8(y), uint8(x + y), 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

func zeros(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]" }

// TestPyEnvExampleFunctionsOnCPU runs the resnet and bert handlers with the pinned PyTorch on the CPU: inputs,
// batches, answers, refusals, the examples of their READMEs, and the same answer from a second process (the weights come
// from the seed).
func TestPyEnvExampleFunctionsOnCPU(t *testing.T) {
	py := pyEnv(t)
	t.Run("resnet", func(t *testing.T) {
		pixels := zeros(3 * 224 * 224)
		requests := []string{
			`{"seed": 1, "logits": true}`,
			`{"seed": 1, "batch": 2, "top_k": 3, "logits": true}`,
			`{"image": "` + pngBase64(t) + `"}`,
			`{"pixels": ` + pixels + `}`,
			`{"pixels": [` + pixels + `, ` + pixels + `]}`,
			`{"batch": 17}`, `{"top_k": 0}`, `{"image": "!!"}`, `{"image": "aGVsbG8="}`, `{"pixels": [1, 2]}`,
			`{"seed": 1, "image": "x"}`, `[]`, `{`, `{"logits": "yes"}`, `{"pixels": [` + pixels + `], "batch": 2}`,
		}
		examples := readmeExamples(functionReadme(t, "resnet"), "resnet")
		requests = append(requests, examples...)
		got := runHandler(t, py, "resnet", requests)

		one := decode[resnetAnswer](t, "seed 1", got[0])
		if one.Model != "resnet152" || one.Device != "cpu" || one.Batch != 1 || one.Input != "seed" ||
			len(one.TopK) != 1 || len(one.TopK[0]) != 5 || len(one.Logits) != 1 || len(one.Logits[0]) != 1000 ||
			one.Summary.Nonfinite != 0 || fmt.Sprint(one.Summary.Shape) != "[1 1000]" {
			t.Fatalf("seed 1: %+v", one)
		}
		for i, c := range one.TopK[0] {
			if c.Class < 0 || c.Class >= 1000 || c.Label == "" || c.Logit == nil || c.Probability == nil ||
				*c.Logit != one.Logits[0][c.Class] || (i > 0 && *c.Logit > *one.TopK[0][i-1].Logit) {
				t.Fatalf("seed 1 top_k[%d] = %+v: want classes by descending logit", i, c)
			}
		}
		two := decode[resnetAnswer](t, "seed 1 batch 2", got[1])
		if two.Batch != 2 || len(two.TopK) != 2 || len(two.TopK[1]) != 3 || two.TopK[1][0].Class != one.TopK[0][0].Class ||
			!closeTo(two.Logits[0], one.Logits[0], 1e-4) || !closeTo(two.Logits[1], one.Logits[0], 1e-4) {
			t.Fatalf("seed 1 batch 2: %d images, top %v: want two copies of the batch-1 answer", two.Batch, two.TopK)
		}
		if img := decode[resnetAnswer](t, "image", got[2]); img.Input != "image" || img.Batch != 1 {
			t.Fatalf("image: %+v", img)
		}
		if px := decode[resnetAnswer](t, "pixels", got[3]); px.Input != "pixels" || px.Batch != 1 {
			t.Fatalf("pixels: %+v", px)
		}
		if px := decode[resnetAnswer](t, "pixels batch", got[4]); px.Batch != 2 {
			t.Fatalf("a list of two pixel images: batch %d", px.Batch)
		}
		for i, mention := range []string{"batch", "top_k", "image", "image", "pixels", "image", "body", "invalid JSON",
			"logits", "batch"} {
			r := got[5+i]
			if r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), mention) {
				t.Errorf("bad request %.80s: %d %s, want 400 naming %q", requests[5+i], r.Status, r.Body, mention)
			}
		}
		for i, r := range got[len(got)-len(examples):] {
			if a := decode[resnetAnswer](t, "example "+examples[i], r); a.Batch < 1 {
				t.Errorf("example %s: %+v", examples[i], a)
			}
		}
		// A second process builds the same model from the seed.
		again := decode[resnetAnswer](t, "seed 1, second process", runHandler(t, py, "resnet", requests[:1])[0])
		if !closeTo(again.Logits[0], one.Logits[0], 1e-5) {
			t.Fatalf("a second process answers other logits for seed 1: the weights are not fixed by the seed")
		}
	})

	t.Run("bert", func(t *testing.T) {
		long := strings.Repeat("word ", 511)
		requests := []string{
			`{"text": "Hello, world!", "embedding": true}`,
			`{"text": ["Hello, world!", "a much longer second input, with more words in it"], "embedding": true}`,
			`{"input_ids": [101, 2000, 3000, 102]}`,
			`{"seed": 5, "seq_len": 16, "batch": 3}`,
			`{"input_ids": [30522]}`, `{"seq_len": 513}`, `{"text": []}`, `{"text": "` + long + `"}`,
			`{"text": "a", "seq_len": 4}`, `{"text": ["a"], "batch": 2}`, `{"embedding": 1}`, `{"input_ids": [[]]}`,
		}
		examples := readmeExamples(functionReadme(t, "bert"), "bert")
		requests = append(requests, examples...)
		got := runHandler(t, py, "bert", requests)

		one := decode[bertAnswer](t, "text", got[0])
		ids := one.InputIDs
		if one.Model != "bert-base" || one.Device != "cpu" || one.Batch != 1 || one.SeqLen != 6 || len(ids) != 1 ||
			len(ids[0]) != 6 || ids[0][0] != 101 || ids[0][5] != 102 || len(one.Embedding) != 1 ||
			len(one.Embedding[0]) != 768 || one.Pooled.Nonfinite != 0 || len(one.Pooled.Head) != 8 ||
			fmt.Sprint(one.Hidden.Shape) != "[1 6 768]" {
			t.Fatalf("text: %+v", one)
		}
		two := decode[bertAnswer](t, "two texts", got[1])
		if two.Batch != 2 || fmt.Sprint(two.InputIDs[0]) != fmt.Sprint(ids[0]) || two.SeqLen <= 6 ||
			!closeTo(two.Embedding[0], one.Embedding[0], 1e-4) || closeTo(two.Embedding[1], one.Embedding[0], 1e-2) {
			t.Fatalf("two texts: the padded first input must answer as alone (masking), the second differently")
		}
		if r := decode[bertAnswer](t, "input_ids", got[2]); r.SeqLen != 4 || r.Input != "input_ids" || r.InputIDs != nil {
			t.Fatalf("input_ids: %+v", r)
		}
		r := decode[bertAnswer](t, "seed batch 3", got[3])
		if r.Batch != 3 || r.SeqLen != 16 || len(r.Pooled.Norm) != 3 || *r.Pooled.Norm[0] != *r.Pooled.Norm[2] {
			t.Fatalf("seed batch 3: %+v", r)
		}
		for i, mention := range []string{"input_ids", "seq_len", "text", "at most 512", "seq_len", "batch", "embedding",
			"input_ids"} {
			r := got[4+i]
			if r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), mention) {
				t.Errorf("bad request %.80s: %d %s, want 400 naming %q", requests[4+i], r.Status, r.Body, mention)
			}
		}
		for i, r := range got[len(got)-len(examples):] {
			if a := decode[bertAnswer](t, "example "+examples[i], r); a.Batch < 1 {
				t.Errorf("example %s: %+v", examples[i], a)
			}
		}
		again := decode[bertAnswer](t, "text, second process", runHandler(t, py, "bert", requests[:1])[0])
		if !closeTo(again.Embedding[0], one.Embedding[0], 1e-5) {
			t.Fatalf("a second process answers another embedding: the weights are not fixed by the seed")
		}
	})
}

// envDir is where the tier keeps function environments between runs: the default of `faas-gpu up`, under
// FAAS_GPU_CACHE when that is set (as test/pyenv/pyenv.sh does).
func envDir(t *testing.T) string {
	t.Helper()
	if c := os.Getenv("FAAS_GPU_CACHE"); c != "" {
		return filepath.Join(c, "envs")
	}
	c, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(c, "faas-gpu", "envs")
}

// simNode is the simulated node of the tier: PyTorch's CUDA 13 build needs sm_75 or newer; the h200 preset reports
// sm_90.
const simNode = "h200x1"

// TestPyEnvExampleFunctionsThroughUp deploys resnet and bert through `faas-gpu up` (their pip requirements
// installed by the local backend into one shared environment), with the gpuserver in dry mode, and invokes them over
// HTTP with the README's examples and batches 1 and 8; vector-add and mlp, deployed beside them, compute exactly as
// before.
func TestPyEnvExampleFunctionsThroughUp(t *testing.T) {
	pyEnv(t)
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	help, _ := exec.Command(bin, "up", "-h").CombinedOutput()
	if !strings.Contains(string(help), "sim-kernels") {
		t.Fatalf("faas-gpu up has no -sim-kernels flag: this test runs PyTorch on the simulated node in dry mode " +
			"(-sim-kernels=dry) and PyTorch through the shim")
	}
	root := repoRoot(t)
	stack, err := shrinkwrap.ReadStack(filepath.Join(root, "stack.yml"))
	if err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	in := startUp(t, stateDir, "--sim-kernels=dry", "--gpus", simNode, "--gpu-memory", "16Gi", "--env-dir", envDir(t))
	base := in.url
	for _, fn := range []string{"resnet", "bert", "vector-add", "mlp"} {
		f := stack.Functions[fn]
		annotations := f.Annotations
		deploy(t, in, types.FunctionDeployment{Service: fn, Image: f.Image, Annotations: &annotations})
	}

	// vector-add and mlp: unchanged and exact.
	raw := invokeReady(t, base+"/function/vector-add", `{"a": [1, 2.5, -3], "b": [10, 20, 30.25]}`)
	var va struct{ C []float64 }
	if err := json.Unmarshal([]byte(raw), &va); err != nil || fmt.Sprint(va.C) != "[11 22.5 27.25]" {
		t.Fatalf("vector-add answered %q, want c = [11 22.5 27.25]", raw)
	}
	x := make([]float64, 1024)
	for i := range x {
		x[i] = float64(i%17) / 17
	}
	body, _ := json.Marshal(map[string]any{"x": x})
	first := invokeReady(t, base+"/function/mlp", string(body))

	// resnet and bert: the first start installs their environment (minutes on a cold cache).
	for _, fn := range []string{"resnet", "bert"} {
		waitStarted(t, in, fn)
	}
	envs := map[string]string{}
	for _, fn := range []string{"resnet", "bert"} {
		logs := functionLogs(t, in, fn)
		m := regexp.MustCompile(`environment (py[0-9.]+-[0-9a-f]{16})`).FindStringSubmatch(logs)
		if m == nil {
			t.Fatalf("%s's log does not name its environment:\n%s", fn, logs)
		}
		envs[fn] = m[1]
		if strings.Contains(logs, "pip: Collecting") {
			envs["installed by"] += fn
		}
	}
	if envs["resnet"] != envs["bert"] || (envs["installed by"] != "" && envs["installed by"] != "resnet" &&
		envs["installed by"] != "bert") {
		t.Fatalf("environments %v: want resnet and bert on one environment, installed at most once", envs)
	}

	post := func(fn, body string) reply {
		t.Helper()
		r := call(t, http.MethodPost, base+"/function/"+fn, body, nil)
		if r.code != http.StatusOK {
			t.Fatalf("%s %s: %d %.500s\nits log:\n%s", fn, body, r.code, r.body, tail(functionLogs(t, in, fn), 40))
		}
		return r
	}
	for _, body := range append(readmeExamples(functionReadme(t, "resnet"), "resnet"), `{"seed": 2}`, `{"seed": 2, "batch": 8}`) {
		var a resnetAnswer
		if err := json.Unmarshal([]byte(post("resnet", body).body), &a); err != nil || a.Device != "cuda" ||
			a.Batch < 1 || len(a.TopK) != a.Batch || a.Summary.Shape[0] != a.Batch {
			t.Fatalf("resnet %s: %+v, %v", body, a, err)
		}
	}
	for _, body := range append(readmeExamples(functionReadme(t, "bert"), "bert"), `{"seed": 2, "seq_len": 128}`,
		`{"seed": 2, "seq_len": 128, "batch": 8}`) {
		var a bertAnswer
		if err := json.Unmarshal([]byte(post("bert", body).body), &a); err != nil || a.Device != "cuda" ||
			a.Batch < 1 || a.Pooled.Shape[0] != a.Batch || a.Pooled.Shape[1] != 768 {
			t.Fatalf("bert %s: %+v, %v", body, a, err)
		}
	}
	if r := call(t, http.MethodPost, base+"/function/resnet", `{"batch": 99}`, nil); r.code != http.StatusBadRequest ||
		!strings.Contains(r.body, "batch") {
		t.Fatalf("resnet with a bad batch: %d %s, want 400 naming batch", r.code, r.body)
	}

	if again := invokeReady(t, base+"/function/mlp", string(body)); again != first {
		t.Fatalf("mlp answered differently after resnet and bert ran on the pool")
	}
	st, err := upGPUServer(t, stateDir).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]uint64{}
	for _, f := range st.Functions {
		served[f.Name] = uint64(f.Served)
	}
	for _, fn := range []string{"resnet", "bert", "vector-add", "mlp"} {
		if served[fn] == 0 {
			t.Errorf("gpuserver: %s served no request (%v)", fn, served)
		}
	}
}

// waitStarted waits until a function has a ready replica, failing at once with the reason when its environment
// failed to install or its process exits before it is ready (PyTorch could not start through the shim).
func waitStarted(t *testing.T, in *instance, fn string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Minute) // a cold install downloads about 3 GB
	for {
		r := in.system(t, http.MethodGet, "/system/function/"+fn, nil)
		var st types.FunctionStatus
		if err := json.Unmarshal([]byte(r.body), &st); err != nil {
			t.Fatalf("status of %s: %d %s", fn, r.code, r.body)
		}
		if st.AvailableReplicas > 0 {
			return
		}
		if st.Annotations != nil && strings.HasPrefix((*st.Annotations)[local.StatusAnnotation], "failed") {
			t.Fatalf("%s: %s", fn, (*st.Annotations)[local.StatusAnnotation])
		}
		if logs := functionLogs(t, in, fn); strings.Contains(logs, "exited before it was ready") {
			t.Fatalf("%s exits before it is ready (PyTorch through the shim on the simulated node); its log:\n%s",
				fn, tail(logs, 60))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not ready after 30 minutes; its log:\n%s", fn, tail(functionLogs(t, in, fn), 60))
		}
		time.Sleep(time.Second)
	}
}

func functionLogs(t *testing.T, in *instance, fn string) string {
	t.Helper()
	r := in.system(t, http.MethodGet, "/system/logs?name="+fn+"&follow=false", nil)
	var sb strings.Builder
	sc := bufio.NewScanner(strings.NewReader(r.body))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m struct {
			Instance string `json:"instance"`
			Text     string `json:"text"`
		}
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			sb.WriteString(m.Instance + " " + m.Text + "\n")
		}
	}
	return sb.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
