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
	"sync"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// gpuFunctionState is the gpuserver's view of one function: requests bound now and released so far.
func gpuFunctionState(t *testing.T, gs *client.Client, name string) (running int, served int64) {
	t.Helper()
	st, err := gs.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range st.Functions {
		if f.Name == name {
			return f.Running, f.Served
		}
	}
	t.Fatalf("the gpuserver does not know %s: %+v", name, st.Functions)
	return 0, 0
}

// TestSharedBindingThroughUp deploys a GPU function whose handler opts in to several requests in flight
// (testdata/batchy: CONCURRENCY = 32, the gpu-python template's FAAS_GPU_CONCURRENCY, which the llm function's
// continuous batching sets) through `faas-gpu up` on the simulated node: 16 concurrent streaming requests are in its
// handler at once (a barrier of 16 passes), all under the same binding, the gpuserver sees one request bound while
// they stream and one served when they end. The same function with FAAS_GPU_CONCURRENCY=1 (the template's default)
// still takes a binding of its own per request.
func TestSharedBindingThroughUp(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	root := repoRoot(t)
	fns := filepath.Join(t.TempDir(), "functions")
	for _, name := range []string{"batchy", "batchy-one"} {
		if err := os.MkdirAll(filepath.Join(fns, name), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"handler.py", "requirements.txt"} {
			b, err := os.ReadFile(filepath.Join(root, "test", "e2e", "testdata", "batchy", f))
			if err == nil {
				err = os.WriteFile(filepath.Join(fns, name, f), b, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	in := startUp(t, stateDir, "--functions-dir", fns)
	annotations := map[string]string{"com.openfaas.gpu.memory": "256Mi"}
	deploy(t, in, types.FunctionDeployment{Service: "batchy", Image: "batchy:latest", Annotations: &annotations})
	deploy(t, in, types.FunctionDeployment{Service: "batchy-one", Image: "batchy-one:latest",
		Annotations: &annotations, EnvVars: map[string]string{"FAAS_GPU_CONCURRENCY": "1"}})
	gs := upGPUServer(t, stateDir)

	// streams sends n concurrent requests ?n=together and answers each one's first line and whether it ended.
	type line struct {
		Binding  string
		Together bool
		Done     bool
	}
	streams := func(fn string, n, together int, held func()) ([]line, []error) {
		first := make([]line, n)
		errs := make([]error, n)
		var got, wg sync.WaitGroup
		got.Add(n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				gotOne := false
				defer func() {
					if !gotOne {
						got.Done()
					}
				}()
				resp, err := http.Post(fmt.Sprintf("%s/function/%s?n=%d", in.url, fn, together), "text/plain", nil)
				if err != nil {
					errs[i] = err
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs[i] = fmt.Errorf("status %d", resp.StatusCode)
					return
				}
				sc := bufio.NewScanner(resp.Body)
				var last line
				for k := 0; sc.Scan(); k++ {
					var l line
					if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
						errs[i] = fmt.Errorf("line %q: %w", sc.Text(), err)
						return
					}
					if k == 0 {
						first[i] = l
						gotOne = true
						got.Done()
					}
					last = l
				}
				if err := sc.Err(); err != nil || !last.Done {
					errs[i] = fmt.Errorf("the stream ended before its last line (%v)", err)
				}
			}()
		}
		got.Wait()
		if held != nil {
			held()
		}
		wg.Wait()
		return first, errs
	}
	release := func(fn string) {
		t.Helper()
		if r := call(t, http.MethodPost, in.url+"/function/"+fn+"?release=1", "", nil); r.code != http.StatusOK {
			t.Errorf("release: %d %s", r.code, r.body)
		}
	}

	invokeReady(t, in.url+"/function/batchy?ready=1", "")
	_, before := gpuFunctionState(t, gs, "batchy")
	var running int
	first, errs := streams("batchy", 16, 16, func() {
		running, _ = gpuFunctionState(t, gs, "batchy") // all 16 have sent their first line and wait
		release("batchy")
	})
	bindings := map[string]int{}
	for i, l := range first {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
		}
		if !l.Together {
			t.Errorf("request %d: the 16 requests were never in the handler at once: %+v", i, l)
		}
		bindings[l.Binding]++
	}
	if len(bindings) != 1 || bindings[""] != 0 {
		t.Errorf("bindings of the 16 requests: %v, want one", bindings)
	}
	if running != 1 {
		t.Errorf("the gpuserver saw %d requests of batchy bound while 16 streamed, want 1 (their shared binding)", running)
	}
	// The 16 and the release request (which joined their binding): one binding, released once.
	testkit.EventuallyNil(t, 30*time.Second, "batchy's binding released once", func() error {
		if r, s := gpuFunctionState(t, gs, "batchy"); r != 0 || s != before+1 {
			return fmt.Errorf("running %d, served %d, want 0 and %d", r, s, before+1)
		}
		return nil
	})

	// The template's default: each request its own binding, one at a time (released at once: ?release=1 first).
	invokeReady(t, in.url+"/function/batchy-one?release=1", "")
	_, before = gpuFunctionState(t, gs, "batchy-one")
	first, errs = streams("batchy-one", 3, 1, nil)
	bindings = map[string]int{}
	for i, l := range first {
		if errs[i] != nil {
			t.Errorf("batchy-one request %d: %v", i, errs[i])
		}
		bindings[l.Binding]++
	}
	if len(bindings) != 3 {
		t.Errorf("bindings of 3 requests with FAAS_GPU_CONCURRENCY=1: %v, want 3 of their own", bindings)
	}
	if _, s := gpuFunctionState(t, gs, "batchy-one"); s != before+3 {
		t.Errorf("batchy-one served %d, want %d", s, before+3)
	}
}

// TestPyEnvLLMBatchingThroughUp deploys the llm function with continuous batching (LLM_MAX_BATCH=16, a tiny Qwen2
// of its own made with save_pretrained, blocks of 4 tokens) through `faas-gpu up` on the simulated node (dry
// kernels: the protocol, the binding and the blocks, not the tokens' values, which test/cuda's TestLLMBatching
// checks on the CPU) and streams 16 concurrent requests of different prompts and max_tokens to its one instance:
// every stream has its max_tokens events and [DONE], the gpuserver sees one request of llm bound throughout (polled
// while they stream) and one served after (one binding for the 16), and the function's /metrics show them decoded
// together and every KV block given back.
func TestPyEnvLLMBatchingThroughUp(t *testing.T) {
	py := pyEnv(t)
	root := repoRoot(t)
	fns := llmFunctionDir(t)
	cmd := exec.Command(filepath.Join(py, "bin", "python3"), filepath.Join(root, "test", "cuda", "testdata",
		"llm_own_model.py"), "make", filepath.Join(fns, "llm"), "qwen2")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "TORCH_DEVICE=cpu")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("llm_own_model.py make: %v\n%s", err, tail(string(out), 30))
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	in := startUp(t, stateDir, "--sim-kernels=dry", "--gpus", simNode, "--gpu-memory", "16Gi",
		"--functions-dir", fns, "--python", filepath.Join(py, "bin", "python3"))
	annotations := map[string]string{"com.openfaas.gpu.memory": "512Mi", "com.openfaas.gpu.scratch": "request"}
	deploy(t, in, types.FunctionDeployment{Service: "llm", Image: "llm:latest", Annotations: &annotations,
		EnvVars: map[string]string{"LLM_MODEL_DIR": "tiny-qwen2", "LLM_MAX_PROMPT_TOKENS": "64",
			"LLM_MAX_TOKENS": "32", "LLM_MAX_BATCH": "16", "LLM_KV_BLOCK_TOKENS": "4"}})
	waitStarted(t, in, "llm")
	base := in.url + "/function/llm"
	invokeReady(t, base+"/v1/completions", `{"prompt": [5, 6, 7], "max_tokens": 2}`)
	gs := upGPUServer(t, stateDir)
	_, before := gpuFunctionState(t, gs, "llm")

	var wg sync.WaitGroup
	stopPolling, polled := make(chan struct{}), make(chan int)
	go func() { // the gpuserver's view while the streams run: the most requests of llm bound at once
		most := 0
		for {
			select {
			case <-stopPolling:
				polled <- most
				return
			case <-time.After(20 * time.Millisecond):
			}
			if st, err := gs.Status(context.Background()); err == nil {
				for _, f := range st.Functions {
					if f.Name == "llm" {
						most = max(most, f.Running)
					}
				}
			}
		}
	}()
	events := make([]int, 16)
	done := make([]bool, 16)
	errs := make([]error, 16)
	want := make([]int, 16)
	for i := range 16 {
		want[i] = 12 + (i*7)%21
		prompt := make([]int, 1+3*i)
		for j := range prompt {
			prompt[j] = 5 + (i*37+j*11)%300
		}
		body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": want[i], "temperature": 0,
			"ignore_eos": true, "stream": true, "return_token_ids": true})
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs[i] = fmt.Errorf("status %d", resp.StatusCode)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line := sc.Text()
				switch {
				case line == "data: [DONE]":
					done[i] = true
				case strings.HasPrefix(line, "data: {") && strings.Contains(line, `"token_ids"`):
					events[i]++
				}
			}
			errs[i] = sc.Err()
		}()
	}
	wg.Wait()
	close(stopPolling)
	running := <-polled
	for i := range 16 {
		if errs[i] != nil || !done[i] || events[i] != want[i] {
			t.Errorf("stream %d: %d token events (want %d), [DONE] %v, %v", i, events[i], want[i], done[i], errs[i])
		}
	}
	if running != 1 {
		t.Errorf("the gpuserver saw at most %d requests of llm bound while 16 streamed: want 1 (one binding)", running)
	}
	if _, s := gpuFunctionState(t, gs, "llm"); s != before+1 {
		t.Errorf("llm served %d requests for the 16 streams, want 1 (one binding, released once)", s-before)
	}
	r := call(t, http.MethodGet, base+"/metrics", nil, nil)
	m := map[string]int{}
	for _, l := range strings.Split(r.body, "\n") {
		var k string
		var v int
		if _, err := fmt.Sscanf(l, "%s %d", &k, &v); err == nil && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	if m["llm_batch_peak"] < 8 || m["llm_kv_blocks_in_use"] != 0 || m["llm_kv_pool_blocks"] != 0 ||
		m["llm_kv_block_allocations_total"] == 0 || m["llm_kv_block_allocations_total"] != m["llm_kv_block_frees_total"] {
		t.Errorf("the function's /metrics after the streams: %v: want 8 or more decoded together, every block back, "+
			"the pool freed", m)
	}
	t.Logf("16 streams: batch peak %d, %d steps, %d sequences decoded in them, KV blocks peak %d", m["llm_batch_peak"],
		m["llm_batch_steps_total"], m["llm_batch_step_sequences_total"], m["llm_kv_blocks_peak"])
}
