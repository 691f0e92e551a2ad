package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// The batching figures (-batch, docs/bench/llm-batch.md): the llm function with continuous batching
// (LLM_MAX_BATCH) against the same function decoding one request at a time (LLM_MAX_BATCH=1, its default), two
// processes of the same code and weights on one timed virtual GPU, driven by test/llmbench/batch_driver.py.

// batchReply is what batch_driver.py answers to run.
type batchReply struct {
	TTFT    []float64      `json:"ttft_s"`
	End     []float64      `json:"end_s"`
	Tokens  []int          `json:"tokens"`
	Wall    float64        `json:"wall_s"`
	Metrics map[string]int `json:"metrics"`
	Error   any            `json:"error"`
}

func (p *proc) run(n, tokens, prompt, offset int) (batchReply, error) {
	var r batchReply
	line, _ := json.Marshal(map[string]any{"cmd": "run", "n": n, "max_tokens": tokens, "prompt_tokens": prompt,
		"offset": offset})
	if _, err := fmt.Fprintf(p.in, "%s\n", line); err != nil {
		return r, err
	}
	if !p.scan() {
		return r, fmt.Errorf("%s ended: %s", p.name, tailOf(p.err.String()))
	}
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		return r, err
	}
	if r.Error != nil {
		return r, fmt.Errorf("%s: %v", p.name, r.Error)
	}
	return r, nil
}

// timedRequest is request with the acquire's duration (the swap-in when the model was evicted) apart.
func (n *node) timedRequest(ctx context.Context, fn string, f func() error) (acquire, hold time.Duration, err error) {
	start := time.Now()
	b, err := n.xn.Acquire(ctx, fn, 0, executor.Host)
	if err != nil {
		return 0, 0, err
	}
	acquire = time.Since(start)
	n.b.mu.Lock()
	n.b.bound[fn] = true
	n.b.mu.Unlock()
	err = f()
	n.b.mu.Lock()
	n.b.bound[fn] = false
	n.b.mu.Unlock()
	b.Release()
	return acquire, time.Since(start), err
}

// level is what was measured at one concurrency.
type level struct {
	c int
	// batched: tokens/s per GPU over the binding's hold, TTFT warm and cold (mean and max over the requests), the
	// binding's hold per request, the batch's mean and peak size, kernels launched per decode step.
	bRate, bTTFT, bTTFTMax, bCold, bColdMax, bHold []float64
	bMean, bPeak, bKernels                         float64
	// one at a time: a request's, measured right after each batched run (the same load); TTFT with the queue.
	sRate, sTTFT, sTTFTMax, sCold, sHold float64
}

func runBatch(ctx context.Context, c config) error {
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		c.startLoad = strings.TrimSpace(string(load))
	}
	var levels []int
	for _, f := range strings.Split(c.concurrency, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return fmt.Errorf("-concurrency %q: a list of positive numbers", c.concurrency)
		}
		levels = append(levels, v)
	}
	maxBatch := 0
	for _, v := range levels {
		maxBatch = max(maxBatch, v)
	}
	py, shim, err := prepare()
	if err != nil {
		return err
	}
	n, stop, err := startNode(ctx, registry{"llm-batch": spec("llm-batch"), "llm-one": spec("llm-one")}, true)
	if err != nil {
		return err
	}
	defer stop()
	const prompt = 32
	script := "test/llmbench/batch_driver.py"
	one, err := startScript(n, py, shim, script, "llm-one", c, "LLM_MAX_BATCH=1")
	if err != nil {
		return err
	}
	defer one.stop()
	bat, err := startScript(n, py, shim, script, "llm-batch", c, fmt.Sprintf("LLM_MAX_BATCH=%d", maxBatch))
	if err != nil {
		return err
	}
	defer bat.stop()
	offset := 0
	for _, p := range []*proc{one, bat} { // the first request ends the initialisation (the model's image)
		if _, _, err := n.timedRequest(ctx, p.name, func() error { _, err := p.run(1, 4, prompt, 0); return err }); err != nil {
			return err
		}
	}
	progress := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "llmbench: "+format+"\n", args...) }

	// single is one request to the function one at a time (warm, or cold: evicted first): its TTFT with the
	// acquire, its binding's hold, kernels launched per token.
	single := func(cold bool) (ttft, hold, kernels float64, err error) {
		if cold {
			if err := n.xn.Evict(ctx, "llm-one", 0); err != nil {
				return 0, 0, 0, err
			}
		}
		before := n.dev.DryLaunches()
		var r batchReply
		acq, d, err := n.timedRequest(ctx, "llm-one", func() error {
			var err error
			r, err = one.run(1, c.tokens, prompt, offset)
			return err
		})
		offset++
		if err != nil {
			return 0, 0, 0, err
		}
		return acq.Seconds() + r.TTFT[0], d.Seconds(), float64(n.dev.DryLaunches()-before) / float64(c.tokens), nil
	}
	var oneHold, oneTTFT, oneCold, oneKernels []float64

	var out []level
	prevSteps, prevSeqs, prevPrefills := 0, 0, 0
	for _, conc := range levels {
		l := level{c: conc}
		var sTTFT, sHold []float64
		for run := range c.runs + 1 { // the last run is cold: the model evicted first
			cold := run == c.runs
			if cold {
				if err := n.xn.Evict(ctx, "llm-batch", 0); err != nil {
					return err
				}
			}
			before := n.dev.DryLaunches()
			var r batchReply
			acq, hold, err := n.timedRequest(ctx, "llm-batch", func() error {
				var err error
				r, err = bat.run(conc, c.tokens, prompt, offset)
				return err
			})
			if err != nil {
				return err
			}
			launches := n.dev.DryLaunches() - before
			offset += conc
			total, ttft, ttftMax := 0, 0.0, 0.0
			for i, t := range r.TTFT {
				total += r.Tokens[i]
				ttft += t + acq.Seconds()
				ttftMax = max(ttftMax, t+acq.Seconds())
			}
			ttft /= float64(conc)
			m := r.Metrics
			steps, seqs := m["llm_batch_steps_total"]-prevSteps, m["llm_batch_step_sequences_total"]-prevSeqs
			prefills := m["llm_batch_prefills_total"] - prevPrefills
			prevSteps, prevSeqs, prevPrefills = m["llm_batch_steps_total"], m["llm_batch_step_sequences_total"],
				m["llm_batch_prefills_total"]
			if m["llm_kv_blocks_in_use"] != 0 || m["llm_kv_pool_blocks"] != 0 {
				return fmt.Errorf("llm-batch after %d sequences: KV blocks still held: %v", conc, m)
			}
			// One request one at a time right after, at the same load.
			st, sh, sk, err := single(cold)
			if err != nil {
				return err
			}
			if cold {
				l.bCold, l.bColdMax = append(l.bCold, ttft), append(l.bColdMax, ttftMax)
				oneCold = append(oneCold, st)
				l.sCold = st
				continue
			}
			oneTTFT, oneHold, oneKernels = append(oneTTFT, st), append(oneHold, sh), append(oneKernels, sk)
			sTTFT, sHold = append(sTTFT, st), append(sHold, sh)
			l.bRate = append(l.bRate, float64(total)/hold.Seconds())
			l.bTTFT, l.bTTFTMax = append(l.bTTFT, ttft), append(l.bTTFTMax, ttftMax)
			l.bHold = append(l.bHold, hold.Seconds()/float64(conc))
			if run == c.runs-1 && steps > 0 {
				l.bMean = float64(seqs) / float64(steps)
				l.bPeak = float64(m["llm_batch_peak"])
				// Launches per forward pass: this run's, over its decode steps and its prefill passes.
				l.bKernels = float64(launches) / float64(steps+prefills)
			}
		}
		// One at a time, the concurrent requests queue: request i (from 0) waits for the i before it.
		h, tt := stats(sHold).mean, stats(sTTFT).mean
		l.sRate, l.sHold = float64(c.tokens)/h, h
		l.sTTFT, l.sTTFTMax = tt+h*float64(conc-1)/2, tt+h*float64(conc-1)
		l.sCold += h * float64(conc-1) / 2
		progress("concurrency %d: batched %.1f tokens/s (one at a time %.1f), TTFT warm %.1f ms, batch mean %.1f",
			conc, stats(l.bRate).mean, l.sRate, 1e3*stats(l.bTTFT).mean, l.bMean)
		out = append(out, l)
	}
	return writeBatchReport(c, out, stats(oneHold), stats(oneTTFT), stats(oneCold), stats(oneKernels), prompt)
}

// roofline is one kernel's GPU time from its shapes: the launch floor, or its bytes at the memory bandwidth, or
// its flops at the tensor rate, whichever is longest (H100 SXM: 3.35 TB/s, 989 TFLOPS bfloat16 dense).
func roofline(bytes, flops float64) time.Duration {
	const floor, bw, rate = 5e-6, 3.35e12, 989e12
	return time.Duration(max(floor, bytes/bw, flops/rate) * 1e9)
}

// kernelShapes lists the large kernels of one decode step of the function's model (Qwen2.5-0.5B's shape, its
// 8,192-token vocabulary, bfloat16) at batch b with context l: per layer the seven projections, attention over the
// gathered keys and values, and the two gathers of the paged cache; the output head once. Every other kernel
// (norms, RoPE, activations, residuals, indexing) touches b x 4,864 values at most: the floor.
func kernelShapes(b, l float64) []struct {
	name  string
	count float64
	t     time.Duration
} {
	const hidden, kv, inter, vocab, layers = 896.0, 128.0, 4864.0, 8192.0, 24.0
	gemm := func(in, out float64) time.Duration { return roofline(2*(in*out+b*(in+out)), 2*b*in*out) }
	return []struct {
		name  string
		count float64
		t     time.Duration
	}{
		{"q, o projections (896 x 896)", 2 * layers, gemm(hidden, hidden)},
		{"k, v projections (896 x 128)", 2 * layers, gemm(hidden, kv)},
		{"gate, up projections (896 x 4,864)", 2 * layers, gemm(hidden, inter)},
		{"down projection (4,864 x 896)", layers, gemm(inter, hidden)},
		{"attention over the context (keys and values read)", layers, roofline(2*b*l*2*kv, 4*b*l*hidden)},
		{"paged gathers (keys, values: read and written)", 2 * layers, roofline(2*2*b*l*kv, 0)},
		{"output head (896 x 8,192, tied)", 1, gemm(hidden, vocab)},
	}
}

func writeBatchReport(c config, levels []level, hold, ttft, cold, kernels stat, prompt int) error {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	load, _ := os.ReadFile("/proc/loadavg")
	w("# Continuous batching in the llm function (simulated node, timed virtual GPU)\n\n")
	w("Written by `go run ./test/llmbench %s` at commit %s on %s; load average (/proc/loadavg) at the start: %s, "+
		"at the end: %s.\n\n", strings.Join(os.Args[1:], " "), commit(), time.Now().UTC().Format(time.RFC3339),
		c.startLoad, strings.TrimSpace(string(load)))
	w("Conditions: **2-core dev VM, no GPU** (%d CPUs seen by Go, shared with other work; Go %s); the llm function "+
		"(functions/llm, 24 layers of Qwen2.5-0.5B's shape, its 8,192-token vocabulary, bfloat16, random weights from "+
		"seed 500), two processes of the same code and weights, driven by `test/llmbench/batch_driver.py` (request "+
		"threads calling the handler, as the gpu-python template's do) through the real shim, remoting server, "+
		"executor and repository on a simulated H100 node in dry kernel mode on the sim's **timed virtual GPU**: each "+
		"kernel holds the GPU's one compute engine for 5 us of modelled time (see the shapes below), copies their "+
		"PCIe link for their modelled time. **batched**: `LLM_MAX_BATCH=%d` (continuous batching, paged KV blocks of "+
		"64 tokens); **one at a time**: `LLM_MAX_BATCH=1`, the function's default (each request decodes alone, static "+
		"KV cache, eager). Each request: a prompt of %d token ids of its own, %d greedy tokens (ignore_eos), streamed. "+
		"The N requests of a concurrency arrive at once; batched, they run under one binding (the executor binds GPU "+
		"0 from the first request's start to the last one's end, as the gpu-python template's shared binding "+
		"holds it); one at a time, each under a binding of its own, one after the other. %d runs per figure "+
		"(means, ranges over runs in parentheses), after one warm-up; cold: one run with the model evicted first "+
		"(swap-in from the host image).\n\n",
		runtime.NumCPU(), runtime.Version(), maxLevel(levels), prompt, c.tokens, c.runs)
	w("**What these figures are, and are not.** No GPU ran: the times are the modelled GPU time of the kernels plus " +
		"host work (Python, PyTorch's dispatch, the scheduler, the shim's records, the gpuserver) on a loaded 2-core VM, " +
		"which dominates here: a GPU machine's host is faster, and the GPU suite has not measured batching. Tokens " +
		"per second per GPU are the decoded tokens over the time the GPU was bound to them.\n\n")
	w("## Decode tokens per second per GPU\n\n")
	w("| concurrent sequences | batched: tokens/s | one at a time: tokens/s | batched / one at a time | batch size, mean (peak) | kernels per step, batched |\n")
	w("|---|---|---|---|---|---|\n")
	for _, l := range levels {
		r := stats(l.bRate)
		w("| %d | %s | %.1f | %.2f | %.1f (%.0f) | %.0f |\n", l.c, r.plain(), l.sRate, r.mean/l.sRate, l.bMean,
			l.bPeak, l.bKernels)
	}
	w("\nOne at a time, more concurrent requests only queue: its tokens/s at each concurrency are one request's, "+
		"measured right after each batched run so that both sides meet the same load of the shared machine (%.0f "+
		"kernels per token; batched, kernels per forward pass, prefills included). Target: at 16, >= 8x batch 1.\n\n",
		kernels.mean)
	w("## Time to first token and the binding's hold\n\n")
	w("| concurrent sequences | batched TTFT warm, mean / max (ms) | one at a time TTFT warm, mean / max (ms) | batched TTFT cold, mean / max (ms) | one at a time TTFT cold, mean (ms) | batched hold per request (ms) | one at a time hold per request (ms) |\n")
	w("|---|---|---|---|---|---|---|\n")
	for _, l := range levels {
		w("| %d | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f | %.1f | %s | %.1f |\n", l.c, 1e3*stats(l.bTTFT).mean,
			1e3*stats(l.bTTFTMax).mean, 1e3*l.sTTFT, 1e3*l.sTTFTMax, 1e3*stats(l.bCold).mean,
			1e3*stats(l.bColdMax).mean, 1e3*l.sCold, stats(l.bHold).ms(), 1e3*l.sHold)
	}
	w("\nTTFT is from the requests' common arrival to each one's first token: batched, a request waits for the "+
		"prefills admitted before it (requests join at a step boundary, prefilled together); one at a time, for the whole "+
		"requests before it (computed from the request's measured TTFT and hold: i holds before request i). Cold adds the swap-in of the model's image (732 MB) from host memory at the first acquire. The hold per "+
		"request is the binding's time over its requests: batched, one binding for all of them. One request alone: "+
		"TTFT warm %s ms, cold %s ms, hold %s ms.\n\n", ttft.ms(), cold.ms(), hold.ms())
	w("## Per-kernel GPU time from the model's shapes\n\n")
	w("Each kernel of a decode step modelled as max(5 us launch floor, bytes / 3.35 TB/s, flops / 989 TFLOPS) "+
		"(an H100 SXM's HBM3 bandwidth and bfloat16 dense rate), at batch b with the longest context here (%d "+
		"tokens):\n\n", prompt+c.tokens)
	w("| kernel (per step) | launches | b = 1 (us) | b = 4 | b = 16 | b = 64 |\n|---|---|---|---|---|---|\n")
	ks := map[int][]struct {
		name  string
		count float64
		t     time.Duration
	}{}
	for _, bb := range []int{1, 4, 16, 64} {
		ks[bb] = kernelShapes(float64(bb), float64(prompt+c.tokens))
	}
	above := false
	for i, k := range ks[1] {
		w("| %s | %.0f |", k.name, k.count)
		for _, bb := range []int{1, 4, 16, 64} {
			t := ks[bb][i].t
			above = above || t > 5*time.Microsecond
			w(" %.2f |", float64(t)/1e3)
		}
		w("\n")
	}
	if above {
		w("\nSome kernels take longer than the floor at these shapes: the uniform 5 us per kernel of the timed " +
			"virtual GPU understates them (the table says by how much).\n")
	} else {
		w("\nAt these shapes every kernel's bytes and flops take less than the floor (the largest, the output head, " +
			"reads 14.7 MB: 4.4 us), so the per-kernel time from the shapes is the 5 us floor for every kernel at " +
			"every batch size measured, which is what the timed virtual GPU gives each dry kernel: a decode step's " +
			"modelled GPU time is its launches x 5 us, almost the same at batch 64 as at batch 1. That is why " +
			"batching pays for a model this small: the GPU time of a step does not grow with the batch until a " +
			"kernel's bytes or flops pass the floor (the MLP projections' at about 1,000 sequences).\n")
	}
	w("\n## Against vLLM\n\nNone compared: no published vLLM figure for this shape (Qwen2.5-0.5B's blocks with an " +
		"8,192-token vocabulary) on an H100 is known to this report, and none was measured (no GPU).\n\n")
	w("## What is left out\n\nCUDA graphs with batching (the batch's shapes change every step; `LLM_CUDA_GRAPHS=1` " +
		"takes `LLM_MAX_BATCH=1`); a paged-attention kernel (the paged cache gathers a batch's blocks per layer, " +
		"two kernels per layer); chunked prefills.\n")
	if err := os.MkdirAll(filepath.Dir(c.out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(c.out, []byte(b.String()), 0o644)
}

func maxLevel(levels []level) int {
	m := 0
	for _, l := range levels {
		m = max(m, l.c)
	}
	return m
}
