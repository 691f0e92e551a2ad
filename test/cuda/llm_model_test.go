package cuda

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
)

// ownModel is what testdata/llm_own_model.py serve prints.
type ownModel struct {
	Models struct {
		Data []struct {
			ID           string
			Root         string
			ModelType    string `json:"model_type"`
			ChatTemplate string `json:"chat_template"`
			VocabSize    int    `json:"vocab_size"`
		}
	}
	Device     string
	Dtype      string
	StopIDs    []int `json:"stop_ids"`
	Completion struct {
		Model          string
		PromptTokenIDs []int `json:"prompt_token_ids"`
		ExpectedIDs    []int `json:"expected_prompt_ids"`
		Tokens         []int
	}
	Chat struct {
		Prompt, Model string
	}
	StreamTokens    []any `json:"stream_tokens"`
	Bad             map[string][]any
	WeightsEqual    bool  `json:"weights_equal"`
	WeightsOnDevice bool  `json:"weights_on_device"`
	Tensors         int   `json:"tensors"`
	ReferenceTokens []int `json:"reference_tokens"`
	Paged           *struct {
		Held         []int
		After, Final map[string]int
		Refused      []any
		Then         int
		PromptTokens int `json:"prompt_tokens"`
	}
}

// pagedEnv is LLM_KV_CACHE=paged with blocks of 4 tokens, at most 12 (48 tokens: the chat prompts and the
// completions fit, a prompt of 60 tokens does not).
var pagedEnv = []string{"LLM_KV_CACHE=paged", "LLM_KV_BLOCK_TOKENS=4", "LLM_KV_MAX_BLOCKS=12"}

// checkPaged checks the paged KV cache's blocks: allocated as the sequence grows (after the i-th streamed token the
// cache holds the prompt and i tokens: ceil((prompt + i) / 4) blocks), all freed when it ends, a request whose
// prompt needs more blocks than LLM_KV_MAX_BLOCKS refused with 429 and Retry-After, the next one served.
func checkPaged(t *testing.T, r ownModel) {
	t.Helper()
	p := r.Paged
	if p == nil {
		t.Fatal("no paged KV cache")
	}
	want := make([]int, 12)
	for i := range want {
		want[i] = (p.PromptTokens + i + 3) / 4
	}
	if !slices.Equal(p.Held, want) {
		t.Errorf("KV blocks held after each streamed token %v, want %v (prompt of %d tokens, blocks of 4)", p.Held,
			want, p.PromptTokens)
	}
	for _, m := range []map[string]int{p.After, p.Final} {
		if m["llm_kv_blocks_in_use"] != 0 || m["llm_kv_block_allocations_total"] == 0 ||
			m["llm_kv_block_allocations_total"] != m["llm_kv_block_frees_total"] || m["llm_kv_blocks_peak"] > 12 {
			t.Errorf("/metrics after the sequences ended: %v, want every block allocated freed, none in use, at "+
				"most 12 at once", m)
		}
	}
	if len(p.Refused) != 3 || p.Refused[0] != float64(429) || p.Refused[1] != "1" ||
		!strings.Contains(fmt.Sprint(p.Refused[2]), "LLM_KV_MAX_BLOCKS") || p.Then != 200 ||
		p.Final["llm_kv_block_refusals_total"] != 1 {
		t.Errorf("a prompt needing 15 blocks: %v, then %d, refusals %d: want 429 with Retry-After naming "+
			"LLM_KV_MAX_BLOCKS, then 200", p.Refused, p.Then, p.Final["llm_kv_block_refusals_total"])
	}
}

// The chat prompts the families' templates (testdata/llm_own_model.py) render for a developer (system) and a
// user message (Mistral's template takes no system message: a user message alone).
var ownChat = map[string]string{
	"qwen2": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
	"llama": "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user" +
		"<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
	"mistral": "<s>[INST] Hello [/INST]",
}

// makeOwnModels writes the tiny models of testdata/llm_own_model.py into a temporary directory (on the CPU, no
// shim) and returns it.
func makeOwnModels(t *testing.T, env string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(env, "bin", "python3"), filepath.Join("testdata", "llm_own_model.py"), "make", dir)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "TORCH_DEVICE=cpu")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("llm_own_model.py make: %v\n%s", err, tail(string(out), 40))
	}
	return dir
}

// ownModelEnv is the function's environment for a model directory (a short context, to keep the tier quick).
func ownModelEnv(dir string, extra ...string) []string {
	return append([]string{"LLM_MODEL_DIR=" + dir, "LLM_MAX_PROMPT_TOKENS=64", "LLM_MAX_TOKENS=32"}, extra...)
}

// checkOwnModel checks what every run of a family's directory must show, wherever it runs.
func checkOwnModel(t *testing.T, fam, dir string, r ownModel) {
	t.Helper()
	name := "tiny-" + fam
	if len(r.Models.Data) != 1 {
		t.Fatalf("/v1/models: %+v", r.Models)
	}
	if m := r.Models.Data[0]; m.ID != name || m.Root != dir || m.ModelType != fam || m.ChatTemplate != "model" ||
		m.VocabSize < 300 {
		t.Errorf("/v1/models: %+v, want id %s (the directory's name), root %s, model_type %s, the model's chat "+
			"template, its own vocabulary", m, name, dir, fam)
	}
	if r.Completion.Model != name || r.Chat.Model != name {
		t.Errorf("answers' model %q and %q, want %q", r.Completion.Model, r.Chat.Model, name)
	}
	// The model's own tokenizer: its BOS (Llama, Mistral) and its merges, not the function's vocabulary.
	if len(r.Completion.PromptTokenIDs) == 0 || !slices.Equal(r.Completion.PromptTokenIDs, r.Completion.ExpectedIDs) {
		t.Errorf("prompt token ids %v, want the model's tokenizer.json's %v", r.Completion.PromptTokenIDs,
			r.Completion.ExpectedIDs)
	}
	if r.Chat.Prompt != ownChat[fam] {
		t.Errorf("chat prompt %q, want the model's template's %q", r.Chat.Prompt, ownChat[fam])
	}
	if len(r.Completion.Tokens) != 12 || fmt.Sprint(r.StreamTokens) != fmt.Sprint(r.Completion.Tokens) {
		t.Errorf("greedy tokens %v, streamed %v: want 12, the same", r.Completion.Tokens, r.StreamTokens)
	}
	if !r.WeightsEqual || !r.WeightsOnDevice || r.Tensors < 20 {
		t.Errorf("weights: equal to the files' %d tensors %v, on the device %v", r.Tensors, r.WeightsEqual,
			r.WeightsOnDevice)
	}
	want := map[string]string{"model": "[404 model]", "token_id": "[400 prompt]", "alternation": "[200 <nil>]"}
	if fam == "mistral" { // its template raises on two user messages in a row
		want["alternation"] = "[400 messages]"
	}
	for k, v := range want {
		if got := fmt.Sprint(r.Bad[k]); got != v {
			t.Errorf("bad request %s: %s, want %s", k, got, v)
		}
	}
}

// TestLLMOwnModel serves a tiny model of each family (Qwen2 with tied embeddings, Llama, Mistral with a sliding
// window longer than the context), made with save_pretrained into a temporary directory, through the llm
// function's handler (LLM_MODEL_DIR): the served name is the directory's, prompts are the model's own tokenizer's
// ids, chat the model's own template, the weights on the device are the files' bytes. On the CPU the greedy tokens
// equal transformers' own generate() on the same directory. Through the shim on the simulated node (dry kernels:
// nothing computed, so only the loading path, the copies of the weights and the protocol are checked there, in
// bfloat16 as a deployment would run them).
func TestLLMOwnModel(t *testing.T) {
	env := requireTier(t)
	models := makeOwnModels(t, env)
	n := startNode(t, sim.KernelsDry)
	for _, fam := range []string{"qwen2", "llama", "mistral"} {
		dir := filepath.Join(models, "tiny-"+fam)
		t.Run(fam+"/cpu-reference", func(t *testing.T) {
			out := python(t, env, ownModelEnv(dir, "TORCH_DEVICE=cpu"), "serve")
			var r ownModel
			decodeLast(t, out, &r)
			checkOwnModel(t, fam, dir, r)
			if r.Device != "cpu" || r.Dtype != "float32" {
				t.Errorf("device %s, dtype %s: want the CPU and the directory's own float32", r.Device, r.Dtype)
			}
			if !slices.Equal(r.Completion.Tokens, r.ReferenceTokens) {
				t.Errorf("greedy tokens %v, transformers' generate %v", r.Completion.Tokens, r.ReferenceTokens)
			}
		})
		// The paged KV cache (LLM_KV_CACHE=paged): the same tokens as transformers' generate, blocks as the
		// sequence grows.
		t.Run(fam+"/cpu-paged", func(t *testing.T) {
			var r ownModel
			decodeLast(t, python(t, env, ownModelEnv(dir, append(pagedEnv, "TORCH_DEVICE=cpu")...), "serve"), &r)
			checkOwnModel(t, fam, dir, r)
			if !slices.Equal(r.Completion.Tokens, r.ReferenceTokens) {
				t.Errorf("paged: greedy tokens %v, transformers' generate %v", r.Completion.Tokens, r.ReferenceTokens)
			}
			checkPaged(t, r)
		})
		if fam == "llama" {
			t.Run(fam+"/shim-paged", func(t *testing.T) {
				var r ownModel
				n.python(t, env, ownModelEnv(dir, append(pagedEnv, "FAAS_GPU=1")...), "llm_own_model.py", &r, "serve")
				checkOwnModel(t, fam, dir, r)
				checkPaged(t, r)
			})
		}
		t.Run(fam+"/shim", func(t *testing.T) {
			var r ownModel
			n.python(t, env, ownModelEnv(dir, "FAAS_GPU=1", "LLM_DTYPE=bfloat16"), "llm_own_model.py", &r, "serve")
			checkOwnModel(t, fam, dir, r)
			if r.Device != "cuda" || r.Dtype != "bfloat16" {
				t.Errorf("device %s, dtype %s: want cuda (the shim), bfloat16 (LLM_DTYPE)", r.Device, r.Dtype)
			}
		})
	}
	// Damage only loading with PyTorch sees: a clear last line naming the directory, exit status 1.
	for _, c := range []struct{ dir, want string }{
		{"broken-missing-tensor", "the weights do not match config.json (missing keys: " +
			"model.layers.1.mlp.down_proj.weight)"},
		{"broken-shape", "loading the weights failed"},
		{"broken-tokenizer", "loading its tokenizer failed"},
		// A sliding window shorter than the context (64 + 32) would need sliding attention: refused, not served
		// with full attention.
		{"broken-window", "the model's sliding window (16 tokens) is shorter than LLM_MAX_PROMPT_TOKENS + " +
			"LLM_MAX_TOKENS = 96"},
		{"broken-context", "LLM_MAX_PROMPT_TOKENS + LLM_MAX_TOKENS = 96 exceeds the model's " +
			"max_position_embeddings (32)"},
	} {
		t.Run(c.dir, func(t *testing.T) {
			dir := filepath.Join(models, c.dir)
			last := failedStart(t, filepath.Join(env, "bin", "python3"), ownModelEnv(dir, "TORCH_DEVICE=cpu"))
			if want := "llm: LLM_MODEL_DIR=" + dir + ": " + c.want; !strings.HasPrefix(last, want) {
				t.Errorf("last line %q, want it to start %q", last, want)
			}
		})
	}
}

// python runs testdata/llm_own_model.py with env's Python on the CPU (no shim) and returns its stdout.
func python(t *testing.T, env string, extra []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(env, "bin", "python3"), append([]string{filepath.Join("testdata",
		"llm_own_model.py")}, args...)...)
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("llm_own_model.py %v: %v\n%s", args, err, tail(stderr.String(), 40))
	}
	return stdout.String()
}

func decodeLast(t *testing.T, out string, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
}

// failedStart imports the llm function's handler as the gpu-python template does and returns the last line it
// wrote (what the provider's status shows of a replica that exits before it is ready); the import must fail with
// exit status 1.
func failedStart(t *testing.T, python string, env []string) string {
	t.Helper()
	fn, err := filepath.Abs("../../functions/llm")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import handler", fn)
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("importing the handler: %v, want exit status 1\n%s", err, tail(string(out), 20))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// writeSafetensors writes a safetensors file of one float32 tensor of n elements, cut to keep bytes of its data.
func writeSafetensors(t *testing.T, path string, n, keep int) {
	t.Helper()
	header := fmt.Sprintf(`{"w":{"dtype":"F32","shape":[%d],"data_offsets":[0,%d]}}`, n, 4*n)
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, uint64(len(header))); err != nil {
		t.Fatal(err)
	}
	b.WriteString(header)
	b.Write(make([]byte, keep))
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLLMModelDirChecks needs only a python3 on PATH, not the pinned environment (so it runs in make test): a bad
// LLM_MODEL_DIR is refused before PyTorch is imported, with one last line that names the directory and what is
// wrong, and exit status 1 (the provider's status then shows that line: "not ready: its replicas exit before they
// are ready (last: exit status 1; its last line: ...)"). A directory that passes the checks reaches `import torch`.
func TestLLMModelDirChecks(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	root := t.TempDir()
	write := func(dir, name, text string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	layout := func(name, modelType string, files ...string) string {
		dir := filepath.Join(root, name)
		write(dir, "config.json", fmt.Sprintf(`{"model_type": %q, "architectures": ["X"]}`, modelType))
		for _, f := range files {
			switch f {
			case "model.safetensors":
				writeSafetensors(t, filepath.Join(dir, f), 16, 64)
			case "truncated":
				writeSafetensors(t, filepath.Join(dir, "model.safetensors"), 16, 40)
			case "index":
				write(dir, "model.safetensors.index.json", `{"weight_map": {"w": "model-00001-of-00002.safetensors", `+
					`"v": "model-00002-of-00002.safetensors"}}`)
				writeSafetensors(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), 4, 16)
			default:
				write(dir, f, "{}")
			}
		}
		return dir
	}
	file := filepath.Join(root, "a-file")
	write(root, "a-file", "x")
	noConfig := filepath.Join(root, "no-config")
	write(noConfig, "model.safetensors", "")
	badJSON := filepath.Join(root, "bad-json")
	write(badJSON, "config.json", "{")
	for _, c := range []struct {
		name, dir, want string
	}{
		{"missing", filepath.Join(root, "nowhere"), "no such directory"},
		{"file", file, "not a directory"},
		{"no-config", noConfig, "no config.json"},
		{"bad-json", badJSON, "config.json is not readable JSON"},
		{"family", layout("gpt2", "gpt2", "model.safetensors", "tokenizer.json"),
			"config.json's model_type 'gpt2' is not supported (supported: qwen2, llama, mistral)"},
		{"no-weights", layout("bin", "llama", "pytorch_model.bin", "tokenizer.json"),
			"no safetensors weights (model.safetensors or model.safetensors.index.json); found pytorch_model.bin"},
		{"truncated", layout("truncated", "qwen2", "truncated", "tokenizer.json"), "truncated: its tensors need"},
		{"shard-missing", layout("shards", "mistral", "index", "tokenizer.json"),
			"model-00002-of-00002.safetensors, which is missing"},
		{"no-tokenizer", layout("no-tok", "llama", "model.safetensors"), "no tokenizer.json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			last := failedStart(t, py, []string{"LLM_MODEL_DIR=" + c.dir})
			if !strings.HasPrefix(last, "llm: LLM_MODEL_DIR="+c.dir+": ") || !strings.Contains(last, c.want) {
				t.Errorf("last line %q, want it to name LLM_MODEL_DIR=%s and say %q", last, c.dir, c.want)
			}
		})
	}
	// A directory that passes reaches the import of PyTorch (which this python3 may lack: then that is the error).
	t.Run("passes", func(t *testing.T) {
		if exec.Command(py, "-c", "import torch").Run() == nil {
			t.Skip("this python3 has torch: TestLLMOwnModel loads real directories")
		}
		last := failedStart(t, py, []string{"LLM_MODEL_DIR=" + layout("good", "qwen2", "model.safetensors",
			"tokenizer.json")})
		if !strings.Contains(last, "No module named 'torch'") {
			t.Errorf("last line %q, want the import of torch (the checks passed)", last)
		}
	})
}
