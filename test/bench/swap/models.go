package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/bench/swap/torchlayout"
)

// servedModels are the models of the pipelining table on real layouts, smallest first.
func servedModels() ([]torchlayout.Model, error) {
	var out []torchlayout.Model
	for _, d := range []int{18, 50, 152} {
		m, err := torchlayout.ResNet(d)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	m, err := torchlayout.BERT("base")
	if err != nil {
		return nil, err
	}
	return append(out, m), nil
}

// benchPipelineModels: pipelined swap-and-execute against serial on the layouts a PyTorch function gives real
// models (package torchlayout), on a timed sim of its own whose kernels are dry (their times from a profile: the
// model's copy time shared out by each tensor's arithmetic). Sim only: a dry kernel on a GPU takes microseconds.
func benchPipelineModels(ctx context.Context, md *bytes.Buffer, nodeName string, scale float64, group uint64,
	maxModel uint64, shm string) error {
	node, err := topology.Resolve(nodeName)
	if err != nil {
		return err
	}
	models, err := servedModels()
	if err != nil {
		return err
	}
	copyTime := func(b uint64) time.Duration { // the swap's groups on host -> GPU 0, one after another
		var d time.Duration
		for off := uint64(0); off < b; off += group {
			d += node.TransferTime(min(group, b-off), topology.HostPath(0), nil)
		}
		return d
	}
	fmt.Fprintf(md, "## Pipelined swap-and-execute on served models' layouts\n\n"+
		"The product pipelines per segment (one event per segment after its copies; a kernel waits for the segments "+
		"its pointer arguments point into), and a segment is one allocation of the function. A PyTorch function's "+
		"allocations are its CUDA caching allocator's, not its layers: requests up to 1 MiB share 2 MiB segments, "+
		"1-10 MiB ones 20 MiB segments, larger ones get their own (package `test/bench/swap/torchlayout` replays "+
		"the allocator's default rules on the model's parameters and buffers, float32, in the order "+
		"`model.to(\"cuda\")` moves them; parameter counts checked against torchvision's and transformers'). One "+
		"dry kernel per tensor reads it and the activations (kept scratch, restored with the model); the kernels' "+
		"times are the model's copy time on host -> GPU 0 shared out by each tensor's arithmetic at batch 1 "+
		"(224x224 images, 128 tokens), so that the pass takes as long as its copy (the regime where pipelining "+
		"gains most); tensors without arithmetic (normalisation, biases, embedding tables, buffers) take the "+
		"sim's launch latency (5 us). *Best*: the least pipelined/serial the layout allows with no latency of any "+
		"kind (`Model.Best`: segments copied in order, kernels in order, each after its segment): above 0.5 by "+
		"the last segment's kernels (after the whole copy) and by copies no kernel's time hides (BERT's 89 MiB "+
		"word-embedding table comes first and is only looked up). A timed sim of its own (x%g, dry kernels), "+
		"times from the device's timing events. Sim only: on a GPU a dry kernel takes microseconds, so "+
		"`-device cuda` leaves this table out.\n\n"+
		"| model | MiB (allocated) | segments (of 2 MiB) | kernels | GFLOP | serial | pipelined | **pipelined/serial** | best |\n"+
		"|---|---|---|---|---|---|---|---|---|\n", scale)
	for _, m := range models {
		if m.Bytes() > maxModel {
			continue
		}
		c := copyTime(m.Bytes())
		kernel := make([]time.Duration, len(m.Tensors))
		for j, tn := range m.Tensors {
			kernel[j] = time.Duration(float64(c) * tn.FLOPs / m.FLOPs())
		}
		serial, pipelined, err := pipelineModel(ctx, node, scale, group, m, kernel, shm)
		if err != nil {
			return fmt.Errorf("%s: %w", m.Name, err)
		}
		copies := make([]time.Duration, len(m.Segments))
		for i, b := range m.Segments {
			copies[i] = copyTime(b)
		}
		kernels := make([]time.Duration, len(kernel))
		for j, d := range kernel {
			kernels[j] = cmp.Or(d, 5*time.Microsecond)
		}
		bp, bs := m.Best(copies, kernels)
		fmt.Fprintf(md, "| %s | %d | %d (%d) | %d | %.1f | %v | %v | **%.2f** | %.2f |\n", m.Name, m.Bytes()/mib,
			len(m.Segments), m.Small(), len(m.Tensors), m.FLOPs()/1e9, serial.Round(10*time.Microsecond),
			pipelined.Round(10*time.Microsecond), pipelined.Seconds()/serial.Seconds(), bp.Seconds()/bs.Seconds())
	}
	fmt.Fprintln(md)
	return nil
}

// pipelineModel swaps m in from the host on a dry timed sim and runs one kernel per tensor after it: serial (after
// the whole swap) and pipelined (each kernel after its segment); modelled times.
func pipelineModel(ctx context.Context, node topology.Node, scale float64, group uint64, m torchlayout.Model,
	kernel []time.Duration, shm string) (serial, pipelined time.Duration, err error) {
	var ptx strings.Builder
	ptx.WriteString(".version 7.0\n.target sm_70\n.address_size 64\n")
	profile := map[string]time.Duration{}
	for j, d := range kernel {
		fmt.Fprintf(&ptx, ".visible .entry k%d(.param .u64 x, .param .u64 w)\n{ ret; }\n", j)
		if d > 0 {
			profile[fmt.Sprintf("k%d", j)] = d
		}
	}
	dev, err := sim.New(sim.Options{Node: node, TimeScale: scale, Kernels: sim.KernelsDry,
		Profile: sim.Profile{Kernels: profile}})
	if err != nil {
		return 0, 0, err
	}
	defer dev.Close(context.WithoutCancel(ctx))
	mem, err := memory.New(dev, memory.Config{Share: 0.9, MaxBytesPerGPU: m.Bytes() + 64*mib,
		SlabChunks: memory.DefaultSlabChunks})
	if err != nil {
		return 0, 0, err
	}
	dir, err := os.MkdirTemp(shm, "models-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	repo, err := repository.Open(repository.Config{Dir: filepath.Join(dir, "repo"), Registrar: dev})
	if err != nil {
		return 0, 0, err
	}
	defer repo.Close()
	n, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo, GroupBytes: group})
	if err != nil {
		return 0, 0, err
	}
	defer n.Close(context.WithoutCancel(ctx))
	const fn = "model"
	if err := n.Register(fn); err != nil {
		return 0, 0, err
	}
	b, err := n.Acquire(ctx, fn, 0, executor.Host)
	if err != nil {
		return 0, 0, err
	}
	s, err := n.Stream(fn)
	if err != nil {
		b.Release()
		return 0, 0, err
	}
	segs := make([]device.Ptr, len(m.Segments))
	for i, size := range m.Segments {
		if segs[i], err = n.Alloc(ctx, fn, size); err == nil {
			err = s.Memset32(segs[i], 0x3c23d70a+uint32(i), size/4)
		}
		if err != nil {
			b.Release()
			return 0, 0, err
		}
	}
	if err := s.Synchronize(ctx); err != nil {
		b.Release()
		return 0, 0, err
	}
	if err := n.Capture(ctx, fn); err != nil {
		b.Release()
		return 0, 0, err
	}
	x, err := n.Alloc(ctx, fn, 16<<10) // the activations: scratch the function keeps
	if err == nil {
		err = s.Memset32(x, 0, 4<<10)
	}
	if err == nil {
		err = s.Synchronize(ctx)
	}
	b.Release()
	if err != nil {
		return 0, 0, err
	}
	dc, err := n.Context(fn, 0)
	if err != nil {
		return 0, 0, err
	}
	mod, err := dc.LoadModule([]byte(ptx.String()))
	if err != nil {
		return 0, 0, err
	}
	defer mod.Unload()
	fns := make([]device.Function, len(kernel))
	for j := range kernel {
		if fns[j], err = mod.Function(fmt.Sprintf("k%d", j)); err != nil {
			return 0, 0, err
		}
	}
	round := func(waitAll bool) (time.Duration, error) {
		if err := n.Evict(ctx, fn, 0); err != nil { // the scratch is written back; the next swap-in restores it
			return 0, err
		}
		b, err := n.Acquire(ctx, fn, 0, executor.Host)
		if err != nil {
			return 0, err
		}
		defer b.Release()
		s, err := n.Stream(fn)
		if err != nil {
			return 0, err
		}
		start, err := dc.NewTimedEvent()
		if err != nil {
			return 0, err
		}
		defer start.Destroy()
		end, err := dc.NewTimedEvent()
		if err != nil {
			return 0, err
		}
		defer end.Destroy()
		if err := s.Record(start); err != nil {
			return 0, err
		}
		if waitAll {
			if err := s.(*executor.Stream).WaitAll(); err != nil {
				return 0, err
			}
		}
		for j, tn := range m.Tensors {
			a, err := device.PackArgs(fns[j].Params(), x, segs[tn.Segment]+device.Ptr(tn.Offset))
			if err != nil {
				return 0, err
			}
			if err := s.Launch(fns[j], device.Dim3{X: 1}, device.Dim3{X: 1}, 0, a); err != nil {
				return 0, err
			}
		}
		if err := s.Record(end); err != nil {
			return 0, err
		}
		if err := s.Synchronize(ctx); err != nil {
			return 0, err
		}
		d, err := end.Elapsed(start)
		return time.Duration(float64(d) / scale), err
	}
	if _, err := round(true); err != nil { // the activations get their host copy at the eviction that follows
		return 0, 0, err
	}
	if serial, err = round(true); err != nil {
		return 0, 0, err
	}
	if pipelined, err = round(false); err != nil {
		return 0, 0, err
	}
	return serial, pipelined, n.Evict(ctx, fn, 0)
}
