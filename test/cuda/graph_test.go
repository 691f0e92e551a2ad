package cuda

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// TestCUDAGraphProgram builds testdata/graph.cu with the pinned nvcc and runs it through the shim on the simulated
// node, whose reference kernels compute every replay: stream capture with the capture queries answering the real
// state, instantiate, three launches with state carried between them, an update from a second capture of the same
// shape, an update refused for another shape, and a capture invalidated by a copy to the host. The program checks
// every value exactly and prints ok.
func TestCUDAGraphProgram(t *testing.T) {
	env := requireTier(t)
	cuda := pyenv.CUDA(env)
	bin := filepath.Join(t.TempDir(), "graph")
	cmd := exec.Command(pyenv.NVCC(env), "-arch=sm_90", "-o", bin, "testdata/graph.cu", "-L"+filepath.Join(cuda, "lib"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nvcc: %v\n%s", err, out)
	}
	n := startNode(t, sim.KernelsReference)
	out := n.run(t, bin)
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") || !strings.Contains(out, "graph: 5 nodes") {
		t.Fatalf("graph program:\n%s", out)
	}
	if got := n.dev.DryLaunches(); got != 0 {
		t.Errorf("%d launches not executed in reference mode", got)
	}
}

// TestTorchCUDAGraph captures a small MLP step with torch.cuda.graph through the shim (dry kernels) and replays
// it: one replay is one asynchronous record and no synchronous call besides the synchronize, where the same step
// run eagerly makes one record per kernel; PyTorch sees the capture state; the GPU random generator works after the
// capture; no call is unsupported.
func TestTorchCUDAGraph(t *testing.T) {
	env := requireTier(t)
	n := startNode(t, sim.KernelsDry)
	var r struct {
		CaptureQueries map[string]bool `json:"capture_queries"`
		Replay, Eager  stats
		Shape          []int
		RandnAfter     []int `json:"randn_after"`
		Total          stats
	}
	n.python(t, env, nil, "torch_graph.py", &r)
	t.Logf("one replay: %v; one eager step: %v", r.Replay, r.Eager)
	if !r.CaptureQueries["is_current_stream_capturing"] || r.CaptureQueries["after"] {
		t.Errorf("capture queries %v: want capturing inside torch.cuda.graph only", r.CaptureQueries)
	}
	if r.Replay.Async != 1 || r.Replay.Sync != 1 {
		t.Errorf("one replay: %+v, want 1 asynchronous record (the graph launch) and 1 synchronous call", r.Replay)
	}
	if r.Eager.Async < 3 {
		t.Errorf("one eager step: %+v, want a record per kernel", r.Eager)
	}
	if len(r.Shape) != 2 || r.Shape[0] != 8 || r.Shape[1] != 256 || len(r.RandnAfter) != 1 {
		t.Errorf("shapes %v %v", r.Shape, r.RandnAfter)
	}
	if r.Total.Unsupported != 0 || r.Total.UnknownSlots != 0 {
		t.Errorf("%d unsupported calls, %d unknown slots", r.Total.Unsupported, r.Total.UnknownSlots)
	}
}

// llmDecode is what testdata/llm_decode.py prints.
type llmDecode struct {
	Greedy, Sampled struct {
		Tokens      []int
		PrefixEqual bool `json:"prefix_equal"`
		Timing      map[string]any
		PerToken    map[string]float64 `json:"per_token"`
	}
	Total        stats
	WeightsEqual bool `json:"weights_equal"`
	WeightsOnGPU bool `json:"weights_on_gpu"`
	Layout       struct {
		Tied           bool
		AdapterTensors int   `json:"adapter_tensors"`
		BaseEnd        int64 `json:"base_end"`
		AdapterStart   int64 `json:"adapter_start"`
		StartAligned   bool  `json:"start_aligned"`
	}
}

// TestLLMDecodeWithCUDAGraphs runs the llm function's handler through the shim on the simulated node (dry kernels;
// two layers of its shape, to keep the tier quick) with and without LLM_CUDA_GRAPHS=1: with graphs the decode step
// is captured and replayed, one asynchronous record per token against hundreds eagerly, and the same tokens come
// out, greedy and sampled. Dry kernels compute nothing, so equal tokens here show that the replayed graph does the
// same copies and memsets as the eager step and that sampling (on the host, from the request's seed) does not
// depend on the graph; that the tokens equal a native run is checked on a GPU (test/gpu).
func TestLLMDecodeWithCUDAGraphs(t *testing.T) {
	env := requireTier(t)
	n := startNode(t, sim.KernelsDry)
	// A variant of the base (a LoRA adapter): its extra kernels go through the shim and into the graph too.
	small := []string{"LLM_LAYERS=2", "LLM_MAX_PROMPT_TOKENS=64", "LLM_MAX_TOKENS=32", "FAAS_GPU=1",
		"LLM_ADAPTER_SEED=7"}
	var eager, graphs llmDecode
	n.python(t, env, append(small, "LLM_CUDA_GRAPHS=0"), "llm_decode.py", &eager)
	n.python(t, env, append(small, "LLM_CUDA_GRAPHS=1"), "llm_decode.py", &graphs)
	t.Logf("eager: %v per token; graphs: %v per token (timing %v)", eager.Greedy.PerToken, graphs.Greedy.PerToken,
		graphs.Greedy.Timing)
	// The device buffer's layout that variants share by: the adapter (2 layers x q and v x A and B) in a chunk of
	// its own after the base, the head tied to the embedding.
	const chunk = 2 << 20
	if l := eager.Layout; !l.Tied || l.AdapterTensors != 8 || !l.StartAligned || l.AdapterStart%chunk != 0 ||
		l.AdapterStart < l.BaseEnd || l.AdapterStart >= l.BaseEnd+chunk {
		t.Errorf("device layout %+v: want the head tied, 8 adapter tensors from the first 2 MiB boundary after "+
			"the base's, the buffer chunk-aligned", l)
	}
	if !eager.WeightsEqual || !eager.WeightsOnGPU {
		t.Errorf("the weights packed into one GPU buffer: equal to a CPU build %v, on the GPU %v", eager.WeightsEqual,
			eager.WeightsOnGPU)
	}
	if graphs.Greedy.Timing["cuda_graphs"] != true || eager.Greedy.Timing["cuda_graphs"] != false {
		t.Fatalf("cuda_graphs: eager %v, graphs %v", eager.Greedy.Timing, graphs.Greedy.Timing)
	}
	for _, c := range []struct {
		name     string
		eager, g []int
	}{{"greedy", eager.Greedy.Tokens, graphs.Greedy.Tokens}, {"sampled", eager.Sampled.Tokens, graphs.Sampled.Tokens}} {
		if len(c.eager) != 24 || fmt.Sprint(c.eager) != fmt.Sprint(c.g) {
			t.Errorf("%s tokens: eager %v, graphs %v", c.name, c.eager, c.g)
		}
	}
	if !eager.Greedy.PrefixEqual || !graphs.Greedy.PrefixEqual || !graphs.Sampled.PrefixEqual {
		t.Errorf("a longer completion does not start with the shorter one's tokens")
	}
	if a := graphs.Greedy.PerToken["Async"]; a != 1 {
		t.Errorf("greedy with graphs: %v asynchronous records per token, want 1 (the graph launch)", a)
	}
	// Reading the token back is a copy and a synchronize of the stream: one round trip, as nothing is sent between
	// the copy and the synchronize, which the shim answers (eagerly as well, and when sampling: the logits are read
	// the same way).
	for _, c := range []struct {
		name string
		per  map[string]float64
	}{{"greedy with graphs", graphs.Greedy.PerToken}, {"greedy eagerly", eager.Greedy.PerToken},
		{"sampled with graphs", graphs.Sampled.PerToken}, {"sampled eagerly", eager.Sampled.PerToken}} {
		if s, a := c.per["Sync"], c.per["SyncsAnswered"]; s != 1 || a != 1 {
			t.Errorf("%s: %v round trips and %v synchronizations answered in the shim per token, want 1 and 1 "+
				"(the read; its synchronize answered in the shim)", c.name, s, a)
		}
	}
	if a := eager.Greedy.PerToken["Async"]; a < 20 {
		t.Errorf("greedy eagerly: %v asynchronous records per token, want one per kernel", a)
	}
	for _, tot := range []stats{eager.Total, graphs.Total} {
		if tot.Unsupported != 0 || tot.UnknownSlots != 0 {
			t.Errorf("%d unsupported calls, %d unknown slots", tot.Unsupported, tot.UnknownSlots)
		}
	}
}
