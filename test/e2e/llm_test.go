package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/local"
	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// llmFunctionDir lays out functions/llm for up's --functions-dir without its pip requirements, so that it runs on
// the pinned test environment's Python (--python) instead of installing the same packages again.
func llmFunctionDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "functions")
	dst := filepath.Join(dir, "llm")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"handler.py", "batching.py", "tokenizer.json"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), "functions", "llm", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dst, "requirements.txt"), []byte("# from the pinned test environment\n"),
		0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPyEnvLLMThroughUpWithOpenAIClient deploys the llm function (Qwen2.5-0.5B's shape, bfloat16) through `faas-gpu
// up` on the simulated node in dry mode and drives it with the real OpenAI Python client: models, completions
// greedy and streamed, chat streamed and not, and bad input answered 400 naming the field. Dry mode runs the
// kernels without computing them, so this checks the protocol, the host-side stop, streaming and that a stream and
// a whole answer carry the same tokens; it cannot check the tokens' values against a native run (the GPU suite
// does). A raw stream shows its first event while the gpuserver still holds the request's binding.
func TestPyEnvLLMThroughUpWithOpenAIClient(t *testing.T) {
	py := pyEnv(t)
	oai := pyenv.Extra(t, "openai")
	root := repoRoot(t)
	stack, err := shrinkwrap.ReadStack(filepath.Join(root, "stack.yml"))
	if err != nil {
		t.Fatal(err)
	}
	f, ok := stack.Functions["llm"]
	if !ok {
		t.Fatal("stack.yml has no llm function")
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	// The function runs on the pinned environment's Python (--python, a virtual environment), in up's default
	// sandbox, which shows that environment and its base interpreter read-only.
	in := startUp(t, stateDir, "--sim-kernels=dry", "--gpus", simNode, "--gpu-memory", "16Gi",
		"--functions-dir", llmFunctionDir(t), "--python", filepath.Join(py, "bin", "python3"))
	annotations := f.Annotations
	deploy(t, in, types.FunctionDeployment{Service: "llm", Image: f.Image, Annotations: &annotations,
		EnvVars: map[string]string{"LLM_MAX_PROMPT_TOKENS": "256", "LLM_MAX_TOKENS": "64"}})
	waitStarted(t, in, "llm")
	requireSandboxed(t, in, "llm")
	base := in.url + "/function/llm/v1"

	// A raw stream: its first event arrives while the binding is held (the rest is still being decoded).
	req, err := http.NewRequest(http.MethodPost, base+"/completions", strings.NewReader(
		`{"prompt": "The GPU pool", "max_tokens": 48, "temperature": 0, "stream": true, "ignore_eos": true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %v\n%s", resp.StatusCode, resp.Header, tail(functionLogs(t, in, "llm"), 40))
	}
	r := bufio.NewReader(resp.Body)
	first, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "data: {") {
		t.Fatalf("first event %q, %v", first, err)
	}
	gs := upGPUServer(t, stateDir)
	st, err := gs.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	held := false
	for _, fs := range st.Functions {
		held = held || (fs.Name == "llm" && fs.Running == 1)
	}
	rest, err := readAll(r)
	resp.Body.Close()
	if err != nil || !strings.HasSuffix(rest, "data: [DONE]\n\n") || strings.Count(rest, "data: ") < 2 {
		t.Fatalf("rest of the stream: %v\n%.2000s", err, rest)
	}
	if !held {
		t.Errorf("the first event arrived after the binding was released (status %+v): the stream was buffered",
			st.Functions)
	}

	// The OpenAI client.
	cmd := exec.Command(filepath.Join(oai, "bin", "python3"), filepath.Join("testdata", "openai_client.py"), base,
		"faas-gpu-llm-0.5b", "12")
	cmd.Env = append(os.Environ(), "NO_PROXY=127.0.0.1", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("openai client: %v\n%s\nfunction log:\n%s", err, stderr, tail(functionLogs(t, in, "llm"), 40))
	}
	var res struct {
		Version string
		Models  []string
		Greedy  struct {
			Text     string
			TokenIDs []int `json:"token_ids"`
			Finish   string
			Usage    map[string]int
			FaasGPU  map[string]any `json:"faas_gpu"`
		}
		Stream struct {
			Text     string
			TokenIDs []int `json:"token_ids"`
			Events   int
			Finish   string
		}
		ChatStream struct {
			Text  string
			Roles []string
			Usage map[string]int
		} `json:"chat_stream"`
		Chat struct {
			Text, Role string
			Usage      map[string]int
		}
		Errors map[string]json.RawMessage
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("openai client printed %q: %v", out, err)
	}
	t.Logf("openai %s: greedy %q %v, function timing %v", res.Version, res.Greedy.Text, res.Greedy.TokenIDs,
		res.Greedy.FaasGPU)
	if len(res.Models) != 1 || res.Models[0] != "faas-gpu-llm-0.5b" {
		t.Errorf("models %v", res.Models)
	}
	if len(res.Greedy.TokenIDs) != 12 || res.Greedy.Finish != "length" || res.Greedy.Usage["completion_tokens"] != 12 {
		t.Errorf("greedy: %+v: want 12 tokens stopped by length on the host", res.Greedy)
	}
	if res.Stream.Text != res.Greedy.Text || !equalInts(res.Stream.TokenIDs, res.Greedy.TokenIDs) ||
		res.Stream.Finish != "length" || res.Stream.Events < 2 {
		t.Errorf("stream %+v differs from the whole answer %+v", res.Stream, res.Greedy)
	}
	if len(res.ChatStream.Roles) != 1 || res.ChatStream.Roles[0] != "assistant" ||
		res.ChatStream.Usage["completion_tokens"] != 12 || res.ChatStream.Text != res.Chat.Text ||
		res.Chat.Role != "assistant" || res.Chat.Usage["completion_tokens"] != 12 {
		t.Errorf("chat: stream %+v, whole %+v: want the same 12 sampled tokens (seed 7)", res.ChatStream, res.Chat)
	}
	for field, raw := range res.Errors {
		var e struct {
			Status int
			Param  string
		}
		if err := json.Unmarshal(raw, &e); err != nil || e.Status != 400 || e.Param != field {
			t.Errorf("bad %s: %s, want 400 naming the field", field, raw)
		}
	}
	if len(res.Errors) != 3 {
		t.Errorf("errors %v", res.Errors)
	}
}

func readAll(r *bufio.Reader) (string, error) {
	var sb strings.Builder
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		line, err := r.ReadString('\n')
		sb.WriteString(line)
		if err != nil {
			if err.Error() == "EOF" {
				return sb.String(), nil
			}
			return sb.String(), err
		}
	}
	return sb.String(), nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// requireSandboxed fails the test unless up runs function in its sandbox wherever the machine allows one (up's
// default, --sandbox auto, says at start whether functions are isolated and why not): then, as root, the function's
// process runs as an id of the sandbox's own range.
func requireSandboxed(t *testing.T, in *instance, function string) {
	t.Helper()
	var line string
	testkit.EventuallyNil(t, 30*time.Second, "up's start-up line about functions' isolation", func() error {
		for _, l := range strings.Split(in.out.String(), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "functions    "); ok && !strings.HasPrefix(rest, "from ") {
				line = rest
				return nil
			}
		}
		return fmt.Errorf("not in:\n%s", in.out.String())
	})
	if !strings.HasPrefix(line, "isolated") {
		t.Logf("this machine allows no sandbox: %s runs unisolated (%s)", function, line)
		return
	}
	pids := startedPIDs(in.out.String(), function)
	if len(pids) == 0 {
		t.Fatalf("up's log names no replica of %s", function)
	}
	uid := functionUID(t, pids[len(pids)-1])
	if os.Geteuid() == 0 && uid <= sandbox.DefaultFirstID {
		t.Errorf("%s runs as uid %d: want an id of the functions' range (above %d)", function, uid,
			sandbox.DefaultFirstID)
	}
	t.Logf("%s runs in up's sandbox as uid %d (up: functions %.60s...)", function, uid, line)
}

// TestPyEnvLLMOwnModelThroughUp deploys the llm function with a model directory of its own: a tiny Qwen2 made with
// save_pretrained (test/cuda/testdata/llm_own_model.py; nothing downloaded) in the function's build context beside
// handler.py, named by a relative LLM_MODEL_DIR, served through `faas-gpu up` on the simulated node (dry kernels:
// the protocol, not the tokens' values; test/cuda checks those against transformers on the CPU), and drives it
// with the real OpenAI client: the served name is the directory's, completions stream, chat uses the model's
// template. A second deployment names a directory that does not exist: its status says why it is not ready, in
// the function's words, naming the path.
func TestPyEnvLLMOwnModelThroughUp(t *testing.T) {
	py := pyEnv(t)
	oai := pyenv.Extra(t, "openai")
	root := repoRoot(t)
	fns := llmFunctionDir(t)
	cmd := exec.Command(filepath.Join(py, "bin", "python3"), filepath.Join(root, "test", "cuda", "testdata",
		"llm_own_model.py"), "make", filepath.Join(fns, "llm"), "qwen2")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "TORCH_DEVICE=cpu")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("llm_own_model.py make: %v\n%s", err, tail(string(out), 30))
	}
	// The same handler without the model, for the deployment that names a missing directory.
	if err := os.MkdirAll(filepath.Join(fns, "llm-missing"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"handler.py", "batching.py", "tokenizer.json", "requirements.txt"} {
		b, err := os.ReadFile(filepath.Join(fns, "llm", f))
		if err == nil {
			err = os.WriteFile(filepath.Join(fns, "llm-missing", f), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	in := startUp(t, stateDir, "--sim-kernels=dry", "--gpus", simNode, "--gpu-memory", "16Gi",
		"--functions-dir", fns, "--python", filepath.Join(py, "bin", "python3"))
	annotations := map[string]string{"com.openfaas.gpu.memory": "512Mi", "com.openfaas.gpu.scratch": "request"}
	env := map[string]string{"LLM_MODEL_DIR": "tiny-qwen2", "LLM_MAX_PROMPT_TOKENS": "64", "LLM_MAX_TOKENS": "32"}
	deploy(t, in, types.FunctionDeployment{Service: "llm", Image: "llm:latest", Annotations: &annotations,
		EnvVars: env})
	missing := "/nonexistent/models/Qwen2.5-0.5B-Instruct"
	deploy(t, in, types.FunctionDeployment{Service: "llm-missing", Image: "llm-missing:latest",
		Annotations: &annotations, EnvVars: map[string]string{"LLM_MODEL_DIR": missing}})
	waitStarted(t, in, "llm")

	cmd = exec.Command(filepath.Join(oai, "bin", "python3"), filepath.Join("testdata", "openai_client.py"),
		in.url+"/function/llm/v1", "tiny-qwen2", "12")
	cmd.Env = append(os.Environ(), "NO_PROXY=127.0.0.1", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("openai client: %v\n%s\nfunction log:\n%s", err, stderr, tail(functionLogs(t, in, "llm"), 40))
	}
	var res struct {
		Models []string
		Greedy struct {
			TokenIDs []int `json:"token_ids"`
			Finish   string
		}
		Stream struct {
			TokenIDs []int `json:"token_ids"`
			Events   int
		}
		ChatStream struct {
			Roles []string
			Usage map[string]int
		} `json:"chat_stream"`
		Errors map[string]json.RawMessage
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("openai client printed %q: %v", out, err)
	}
	if len(res.Models) != 1 || res.Models[0] != "tiny-qwen2" {
		t.Errorf("models %v, want [tiny-qwen2] (the directory's name)", res.Models)
	}
	if len(res.Greedy.TokenIDs) != 12 || res.Greedy.Finish != "length" || res.Stream.Events < 12 ||
		!equalInts(res.Stream.TokenIDs, res.Greedy.TokenIDs) {
		t.Errorf("greedy %+v, stream %+v: want 12 tokens, streamed one event per token, the same", res.Greedy,
			res.Stream)
	}
	// The chat prompt is the model's template's: "<|im_start|>user\nSay hello<|im_end|>\n<|im_start|>assistant\n".
	// Its length in the model's tokens is checked in test/cuda; here, that a chat streams through the client.
	if len(res.ChatStream.Roles) != 1 || res.ChatStream.Usage["completion_tokens"] != 12 ||
		res.ChatStream.Usage["prompt_tokens"] < 5 {
		t.Errorf("chat stream %+v", res.ChatStream)
	}
	if len(res.Errors) != 3 {
		t.Errorf("errors %v", res.Errors)
	}

	want := fmt.Sprintf("its last line: %q", "llm: LLM_MODEL_DIR="+missing+": no such directory")
	testkit.EventuallyNil(t, 2*time.Minute, "llm-missing's status names its model directory", func() error {
		st := functionStatus(t, in, "llm-missing")
		s := ""
		if st.Annotations != nil {
			s = (*st.Annotations)[local.StatusAnnotation]
		}
		if st.AvailableReplicas != 0 || !strings.HasPrefix(s, "not ready: ") || !strings.Contains(s, want) {
			return fmt.Errorf("status %q (%d available), want it not ready with %s", s, st.AvailableReplicas, want)
		}
		return nil
	})
}
