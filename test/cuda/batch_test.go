package cuda

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
)

// TestLLMBatchingScheduler needs only a python3 on PATH (so it runs in make test): functions/llm/batching.py, the
// llm function's continuous batching, driven by testdata/llm_batching.py's toy model, whose next token is a hash of
// the sequence read back from its KV blocks: 16 concurrent sequences of different prompt lengths and max_tokens
// decode the tokens each decodes alone, together (steps of 8 or more), at most max_batch at once; clients that go
// away leave at the next step and the others are unchanged; with LLM_KV_MAX_BLOCKS a sequence that can never fit is
// refused and the others wait for blocks; a failing step ends its batch and the next requests are served; every
// block comes back, the pool is given back when no sequence is active, and no engine call happens while no request
// holds a sequence (the binding).
func TestLLMBatchingScheduler(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	cmd := exec.Command(py, filepath.Join("testdata", "llm_batching.py"))
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("llm_batching.py: %v\n%s", err, out)
	}
	var checks map[string]bool
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &checks); err != nil {
		t.Fatalf("llm_batching.py printed %q: %v", out, err)
	}
	if len(checks) < 19 {
		t.Errorf("only %d checks ran: %v", len(checks), checks)
	}
	for name, ok := range checks {
		if !ok {
			t.Errorf("%s: false", name)
		}
	}
}

// batchRun is what testdata/llm_batch.py prints.
type batchRun struct {
	Device            string
	MaxBatch          int            `json:"max_batch"`
	Alone, Concurrent []any          // token ids per request, or why a stream was not whole
	Reference         [][]int        // transformers' generate (nil for the sampled ones), on the CPU
	MaxTokens         []int          `json:"max_tokens"`
	PromptTokens      []int          `json:"prompt_tokens"`
	DuringMax         map[string]int `json:"during_max"`
	After, Final      map[string]int
	Cancel            []any
	CancelAlone       []any `json:"cancel_alone"`
}

// checkBatch checks a run of testdata/llm_batch.py: every stream's tokens are the same request's decoded alone
// (exact; else only their number: dry kernels), the requests decoded together, every KV block came back and the
// pool was freed, a client that went away left.
func checkBatch(t *testing.T, r batchRun, exact bool) {
	t.Helper()
	if len(r.Concurrent) != 16 || len(r.MaxTokens) != 16 {
		t.Fatalf("%d streams, %d max_tokens", len(r.Concurrent), len(r.MaxTokens))
	}
	if exact && fmt.Sprint(r.Concurrent) != fmt.Sprint(r.Alone) {
		t.Errorf("16 concurrent streams differ from the same requests decoded alone:\nconcurrent %v\nalone      %v",
			r.Concurrent, r.Alone)
	}
	for i, a := range r.Concurrent {
		if toks, ok := a.([]any); !ok || len(toks) != r.MaxTokens[i] {
			t.Errorf("request %d: %v, want %d tokens", i, a, r.MaxTokens[i])
		}
	}
	if r.DuringMax["llm_batch_active"] < 8 {
		t.Errorf("at most %d sequences decoded together while 16 requests ran: want 8 or more", r.DuringMax["llm_batch_active"])
	}
	for _, m := range []map[string]int{r.After, r.Final} {
		if m["llm_kv_blocks_in_use"] != 0 || m["llm_kv_pool_blocks"] != 0 || m["llm_kv_block_allocations_total"] == 0 ||
			m["llm_kv_block_allocations_total"] != m["llm_kv_block_frees_total"] || m["llm_batch_active"] != 0 {
			t.Errorf("/metrics after the batch: %v: want every block given back, the pool freed, no sequence active", m)
		}
	}
	if p := r.After["llm_batch_prefills_total"]; p == 0 || p >= 16 {
		t.Errorf("%d prefill passes for 16 requests arriving together: want them prefilled together", p)
	}
	if r.DuringMax["llm_kv_blocks_in_use"] == 0 || r.DuringMax["llm_kv_pool_blocks"] == 0 {
		t.Errorf("/metrics while the batch ran: %v: want blocks in use", r.DuringMax)
	}
	if len(r.Cancel) != 3 {
		t.Fatalf("cancel: %v", r.Cancel)
	}
	c, ok := r.Cancel[0].([]any)
	if !ok || len(c) != 3 || r.Final["llm_batch_cancelled_total"] != 1 ||
		exact && fmt.Sprint(r.Cancel[1:]) != fmt.Sprint(r.CancelAlone[1:]) {
		t.Errorf("a client going away after 3 tokens: %v (cancelled %d), the others %v, alone %v", r.Cancel[0],
			r.Final["llm_batch_cancelled_total"], r.Cancel[1:], r.CancelAlone[1:])
	}
}

// TestLLMBatching runs the llm function with continuous batching (LLM_MAX_BATCH=16, blocks of 4 tokens) on tiny
// Qwen2 and Llama directories (testdata/llm_own_model.py) on the CPU, where the kernels compute: 16 concurrent
// streamed requests of prompts of 1 to 46 tokens and max_tokens of 2 to 30 (14 greedy, 2 sampled with seeds), each
// from a thread of its own (prefilled together, left-padded), yield exactly the tokens of the same request decoded alone by the function without
// batching, and the greedy ones those of transformers' generate(); they decode together (8 or more per step), KV
// blocks are given to sequences as they grow and all come back, the pool is freed when the batch ends (/metrics),
// and a client that goes away leaves the batch without changing the others' tokens. Then through the shim on the
// simulated node (dry kernels: the protocol and the blocks, not the tokens' values).
func TestLLMBatching(t *testing.T) {
	env := requireTier(t)
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(env, "bin", "python3"), filepath.Join("testdata", "llm_own_model.py"), "make", dir,
		"qwen2", "llama")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "TORCH_DEVICE=cpu")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("llm_own_model.py make: %v\n%s", err, tail(string(out), 40))
	}
	batchEnv := func(model string, extra ...string) []string {
		return append(ownModelEnv(filepath.Join(dir, "tiny-"+model), "LLM_MAX_BATCH=16", "LLM_KV_BLOCK_TOKENS=4"),
			extra...)
	}
	for _, fam := range []string{"qwen2", "llama"} {
		t.Run(fam+"/cpu", func(t *testing.T) {
			c := exec.Command(filepath.Join(env, "bin", "python3"), filepath.Join("testdata", "llm_batch.py"))
			c.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), batchEnv(fam, "TORCH_DEVICE=cpu")...)
			out, err := c.Output()
			if err != nil {
				t.Fatalf("llm_batch.py: %v\n%s", err, out)
			}
			var r batchRun
			decodeLast(t, string(out), &r)
			checkBatch(t, r, true)
			if r.Device != "cpu" || len(r.Reference) != 16 {
				t.Fatalf("device %s, %d references", r.Device, len(r.Reference))
			}
			for i, ref := range r.Reference {
				if ref != nil && fmt.Sprint(ref) != fmt.Sprint(r.Concurrent[i]) {
					t.Errorf("request %d: batched %v, transformers' generate %v", i, r.Concurrent[i], ref)
				}
			}
		})
	}
	t.Run("llama/shim", func(t *testing.T) {
		n := startNode(t, sim.KernelsDry)
		var r batchRun
		n.python(t, env, batchEnv("llama", "FAAS_GPU=1", "LLM_DTYPE=bfloat16"), "llm_batch.py", &r, "protocol")
		if r.Device != "cuda" {
			t.Fatalf("device %s, want cuda (the shim)", r.Device)
		}
		checkBatch(t, r, false)
	})
}
