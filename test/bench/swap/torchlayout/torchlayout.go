// Package torchlayout gives the device allocations a PyTorch function makes for a real model's weights, and the
// tensors in them with their arithmetic, so that the swap bench (test/bench/swap) and its guard test
// (gpuserver/executor TestPipelinedSwapAndExecuteBeatsSerial) pipeline the way the product pipelines a served model.
//
// The product pipelines a swap-in per segment: one event per segment, recorded after its copies, and a kernel waits
// for the segments its pointer arguments point into (gpuserver/executor: completeLocked, Stream.gate). A segment is
// one allocation of the function (cuMemAlloc of at least half a chunk; smaller ones share chunk-sized segments). A
// PyTorch function does not allocate per tensor: its CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp,
// default configuration) rounds a request up to 512 bytes, serves requests of at most 1 MiB from 2 MiB segments and
// requests below 10 MiB from 20 MiB segments, gives a larger request a segment of its own rounded up to 2 MiB, and
// places each request in the smallest free block that fits (splitting it when more than 512 bytes, or for the large
// pool 1 MiB, would be left). Layout replays those rules on the tensors in the order `model.to("cuda")` moves them
// (a module's children first, then its parameters, then its buffers), which for these models is their forward
// order. What it leaves out: the allocator's per-stream pools (one stream here), expandable segments
// (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True maps 2 and 20 MiB pages of one range instead, across which a
// tensor runs, so the executor makes work on a page wait for the pages after it: no pipelining inside a range), and
// allocations other than the weights (activations, workspaces: scratch, made after the capture).
package torchlayout

import (
	"fmt"
	"time"
)

// The caching allocator's constants (default configuration).
const (
	minBlock     = 512
	smallSize    = 1 << 20
	smallBuffer  = 2 << 20
	largeBuffer  = 20 << 20
	minLargeSize = 10 << 20
	roundLarge   = 2 << 20
)

// Tensor is one parameter or buffer of a model, in the order PyTorch moves it to the GPU.
type Tensor struct {
	Name string
	// Bytes is the tensor's own size (elements times element size).
	Bytes uint64
	// FLOPs is the arithmetic of the forward pass's kernel that reads it (batch 1; 0 for a normalisation's or a
	// bias's parameters, an embedding table, a buffer: their kernels are short and memory-bound).
	FLOPs float64
	// Segment is the index of the allocation holding it (Model.Segments), Offset its place there.
	Segment int
	Offset  uint64
}

// Model is a model's weights as a PyTorch function allocates them.
type Model struct {
	Name    string
	Tensors []Tensor
	// Segments are the sizes of the function's device allocations, in the order it made them.
	Segments []uint64
}

// Bytes is the total size of the model's allocations.
func (m Model) Bytes() uint64 {
	var s uint64
	for _, b := range m.Segments {
		s += b
	}
	return s
}

// FLOPs is the forward pass's arithmetic on the weights.
func (m Model) FLOPs() float64 {
	var s float64
	for _, t := range m.Tensors {
		s += t.FLOPs
	}
	return s
}

// Small counts the segments of 2 MiB from the small pool.
func (m Model) Small() int {
	n := 0
	for _, b := range m.Segments {
		if b == smallBuffer {
			n++
		}
	}
	return n
}

type block struct{ off, size uint64 }

type segment struct {
	small bool
	free  []block
}

// Layout places the tensors in allocations as PyTorch's caching allocator does by default (package comment).
func Layout(name string, tensors []Tensor) Model {
	m := Model{Name: name, Tensors: append([]Tensor(nil), tensors...)}
	var segs []segment
	for i := range m.Tensors {
		size := max(minBlock, (m.Tensors[i].Bytes+minBlock-1)/minBlock*minBlock)
		small := size <= smallSize
		bs, bb := -1, -1
		for si, s := range segs {
			if s.small != small {
				continue
			}
			for bi, b := range s.free {
				if b.size >= size && (bs < 0 || b.size < segs[bs].free[bb].size) {
					bs, bb = si, bi
				}
			}
		}
		if bs < 0 {
			alloc := uint64(smallBuffer)
			switch {
			case small:
			case size < minLargeSize:
				alloc = largeBuffer
			default:
				alloc = (size + roundLarge - 1) / roundLarge * roundLarge
			}
			segs = append(segs, segment{small: small, free: []block{{0, alloc}}})
			m.Segments = append(m.Segments, alloc)
			bs, bb = len(segs)-1, 0
		}
		b := segs[bs].free[bb]
		m.Tensors[i].Segment, m.Tensors[i].Offset = bs, b.off
		rest := b.size - size
		if (small && rest >= minBlock) || (!small && rest > smallSize) {
			segs[bs].free[bb] = block{b.off + size, rest}
		} else {
			segs[bs].free = append(segs[bs].free[:bb], segs[bs].free[bb+1:]...)
		}
	}
	return m
}

// Best is the least time pipelined swap-and-execute can take against serial on one copy stream and one compute
// engine, with no latency of any kind: the segments are copied in order (copy[i] long), the tensors' kernels run in
// order (kernel[j] long), and a kernel starts once the kernel before it ended and its tensor's segment landed.
// Serial is the whole copy then every kernel.
func (m Model) Best(copy []time.Duration, kernel []time.Duration) (pipelined, serial time.Duration) {
	landed := make([]time.Duration, len(copy))
	var t time.Duration
	for i, c := range copy {
		t += c
		landed[i] = t
	}
	var k, sum time.Duration
	for j, tn := range m.Tensors {
		k = max(k, landed[tn.Segment]) + kernel[j]
		sum += kernel[j]
	}
	return k, t + sum
}

// ResNet is torchvision's resnet<depth> (18, 34, 50, 101 or 152), float32, its arithmetic at batch 1 on 224x224.
func ResNet(depth int) (Model, error) {
	var blocks []int
	bottleneck := depth >= 50
	switch depth {
	case 18:
		blocks = []int{2, 2, 2, 2}
	case 34, 50:
		blocks = []int{3, 4, 6, 3}
	case 101:
		blocks = []int{3, 4, 23, 3}
	case 152:
		blocks = []int{3, 8, 36, 3}
	default:
		return Model{}, fmt.Errorf("resnet%d: not a torchvision depth (18, 34, 50, 101, 152)", depth)
	}
	var ts []Tensor
	conv := func(name string, in, out, k, hw int) { // hw: the output's side
		w := uint64(out * in * k * k)
		ts = append(ts, Tensor{Name: name, Bytes: 4 * w, FLOPs: 2 * float64(w) * float64(hw*hw)})
	}
	bn := func(name string, c int) {
		for _, p := range []string{"weight", "bias", "running_mean", "running_var"} {
			ts = append(ts, Tensor{Name: name + "." + p, Bytes: 4 * uint64(c)})
		}
		ts = append(ts, Tensor{Name: name + ".num_batches_tracked", Bytes: 8})
	}
	conv("conv1", 3, 64, 7, 112)
	bn("bn1", 64)
	in := 64
	for l, n := range blocks {
		width, hw := 64<<l, 56>>l
		for b := range n {
			p := fmt.Sprintf("layer%d.%d.", l+1, b)
			stride := l > 0 && b == 0
			out := width
			if bottleneck {
				out = 4 * width
				hw1 := hw // torchvision v1.5: the stride is on the 3x3 convolution
				if stride {
					hw1 = 2 * hw
				}
				conv(p+"conv1", in, width, 1, hw1)
				bn(p+"bn1", width)
				conv(p+"conv2", width, width, 3, hw)
				bn(p+"bn2", width)
				conv(p+"conv3", width, out, 1, hw)
				bn(p+"bn3", out)
			} else {
				conv(p+"conv1", in, width, 3, hw)
				bn(p+"bn1", width)
				conv(p+"conv2", width, width, 3, hw)
				bn(p+"bn2", width)
			}
			if b == 0 && (stride || in != out) {
				conv(p+"downsample.0", in, out, 1, hw)
				bn(p+"downsample.1", out)
			}
			in = out
		}
	}
	ts = append(ts, Tensor{Name: "fc.weight", Bytes: 4 * uint64(in*1000), FLOPs: 2 * float64(in*1000)},
		Tensor{Name: "fc.bias", Bytes: 4 * 1000})
	return Layout(fmt.Sprintf("ResNet-%d", depth), ts), nil
}

// BERT is Hugging Face's BertModel (base: 12 layers of 768, large: 24 of 1024), float32, its arithmetic at batch 1
// on 128 tokens (the linear layers; the attention's own products, 3% of a base layer's, are left out).
func BERT(size string) (Model, error) {
	layers, h := 12, 768
	switch size {
	case "base":
	case "large":
		layers, h = 24, 1024
	default:
		return Model{}, fmt.Errorf("bert-%s: neither base nor large", size)
	}
	const vocab, positions, seq = 30522, 512, 128
	ff := 4 * h
	var ts []Tensor
	f32 := func(name string, n int) { ts = append(ts, Tensor{Name: name, Bytes: 4 * uint64(n)}) }
	linear := func(name string, in, out int) {
		ts = append(ts, Tensor{Name: name + ".weight", Bytes: 4 * uint64(in*out), FLOPs: 2 * seq * float64(in*out)})
		f32(name+".bias", out)
	}
	f32("embeddings.word_embeddings.weight", vocab*h)
	f32("embeddings.position_embeddings.weight", positions*h)
	f32("embeddings.token_type_embeddings.weight", 2*h)
	f32("embeddings.LayerNorm.weight", h)
	f32("embeddings.LayerNorm.bias", h)
	ts = append(ts, Tensor{Name: "embeddings.position_ids", Bytes: 8 * positions},
		Tensor{Name: "embeddings.token_type_ids", Bytes: 8 * positions})
	for l := range layers {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		for _, q := range []string{"query", "key", "value"} {
			linear(p+"attention.self."+q, h, h)
		}
		linear(p+"attention.output.dense", h, h)
		f32(p+"attention.output.LayerNorm.weight", h)
		f32(p+"attention.output.LayerNorm.bias", h)
		linear(p+"intermediate.dense", h, ff)
		linear(p+"output.dense", ff, h)
		f32(p+"output.LayerNorm.weight", h)
		f32(p+"output.LayerNorm.bias", h)
	}
	ts = append(ts, Tensor{Name: "pooler.dense.weight", Bytes: 4 * uint64(h*h), FLOPs: 2 * float64(h*h)})
	f32("pooler.dense.bias", h)
	return Layout("BERT-"+size, ts), nil
}
