package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"time"
)

func main() {
	var cfg Config
	out := flag.String("out", "docs/bench/queue.md", "report file")
	flag.IntVar(&cfg.Messages, "messages", 20000, "messages per throughput run")
	flag.IntVar(&cfg.Publishers, "publishers", 16, "concurrent front-door clients in the end-to-end run")
	flag.IntVar(&cfg.Repeat, "repeat", 3, "throughput runs per order (interleaved; the report gives each run and the median)")
	flag.IntVar(&cfg.Idle, "idle", 300, "closed-loop calls for the idle latency")
	flag.IntVar(&cfg.MaxInflight, "max-inflight", 32, "worker max_inflight in the throughput runs")
	flag.StringVar(&cfg.ModelsPath, "models", "../shared/workloads/models-torpor-v100.csv", "models-torpor-v100.csv")
	flag.StringVar(&cfg.Preset, "gpus", "v100x4", "gpuserver node preset of the overload scenario")
	flag.Float64Var(&cfg.Factor, "factor", 2, "burst arrival rate as a multiple of the pool's capacity")
	flag.DurationVar(&cfg.Burst, "burst", 2*time.Second, "burst duration")
	flag.Uint64Var(&cfg.Seed, "seed", 1, "seed of the arrivals")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "queuebench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "queuebench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "queuebench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	md := r.Markdown()
	if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "queuebench:", err)
		os.Exit(1)
	}
	fmt.Print(md)
}
