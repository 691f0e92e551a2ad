package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

func runPool(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("pool", flag.ContinueOnError)
	stateDir := fs.String("state-dir", "./.faas-gpu", "state dir of the `faas-gpu up` to show (its gpuserver.sock and nats-url)")
	var gs readerFlags
	gs.register(fs)
	natsURL := fs.String("nats-url", "", "NATS server of the queues (default: the one `faas-gpu up` wrote to <state-dir>/nats-url); none: the GPU pool only")
	asJSON := fs.Bool("json", false, "print the raw status as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *stateDir == "" {
		return usageError{errors.New("-state-dir: must not be empty")}
	}
	c, err := gs.client(*stateDir)
	if err != nil {
		return err
	}
	socket := &gs.socket
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	if *natsURL == "" {
		// Beside the socket: <state-dir>/nats-url by default, and for an explicit -socket its up's state dir.
		if raw, err := os.ReadFile(filepath.Join(filepath.Dir(*socket), natsURLFile)); err == nil {
			*natsURL = strings.TrimSpace(string(raw))
		}
	}
	var queues *queueView
	if *natsURL != "" && *natsURL != "none" {
		q, err := readQueues(ctx, *natsURL)
		if err != nil {
			return fmt.Errorf("queues at %s: %w", *natsURL, err)
		}
		queues = &q
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			pool.Status
			Queues *queueView `json:"queues,omitempty"`
		}{st, queues})
	}
	printPool(stdout, st)
	if r, ok := readSandboxReport(filepath.Dir(*socket)); ok {
		fmt.Fprintf(stdout, "\nfunctions: %s\n", r.Summary())
	}
	if queues != nil {
		printQueues(stdout, *queues)
	}
	return nil
}

// queueView is the queues' state beside the pool.
type queueView struct {
	Queues      []queue.State `json:"queues"`
	DeadLetters uint64        `json:"dead_letters"`
}

func readQueues(ctx context.Context, url string) (queueView, error) {
	nc, err := nats.Connect(url, nats.Name("faas-gpu pool"), nats.Timeout(5*time.Second))
	if err != nil {
		return queueView{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return queueView{}, err
	}
	states, dead, err := queue.States(ctx, js)
	if err != nil {
		return queueView{}, err
	}
	return queueView{Queues: states, DeadLetters: dead}, nil
}

func printQueues(w io.Writer, q queueView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nQUEUE\tSTREAM\tMESSAGES\tPENDING\tIN WORKER\tREDELIVERED\tCONSUMERS")
	for _, s := range q.Queues {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", s.Queue, s.Stream, s.Messages, s.Pending, s.AckPending,
			s.Redelivered, s.Consumers)
	}
	fmt.Fprintf(tw, "dead letters: %d\n", q.DeadLetters)
	tw.Flush()
}

func printPool(w io.Writer, st pool.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "policy: %s\tqueued: %d\tswaps: none %d, nvlink %d, pcie %d", st.Policy, st.Queued,
		st.Swaps["none"], st.Swaps["nvlink"], st.Swaps["pcie"])
	if ev := st.Evictions; ev != nil {
		fmt.Fprintf(tw, "\tevictions: controller %d, data plane %d (pressure %d, reclaim %d)", ev.Controller,
			ev.DataPlane["pressure"]+ev.DataPlane["reclaim"], ev.DataPlane["pressure"], ev.DataPlane["reclaim"])
	}
	fmt.Fprint(tw, "\n\n")
	switch st.SimKernels {
	case "dry":
		fmt.Fprintf(tw, "SIMULATED GPUS IN DRY KERNEL MODE (--sim-kernels=dry): kernels the simulator cannot compute "+
			"are accepted and not executed, their results are wrong (%d launches not executed)\n\n", st.SimDryLaunches)
	case "":
	default:
		fmt.Fprintf(tw, "simulated GPUs: kernels %s (reference kernels computed, others refused)\n\n", st.SimKernels)
	}
	fmt.Fprintln(tw, "GPU\tNAME\tBUSY\tHEALTHY\tMEMORY USED\tRESIDENT")
	for _, g := range st.GPUs {
		fmt.Fprintf(tw, "%d\t%s\t%v\t%v\t%s / %s\t%s\n", g.Index, g.Name, g.Busy, g.Healthy, mib(g.UsedBytes),
			mib(g.MemoryBytes), strings.Join(g.Resident, ","))
	}
	fmt.Fprintln(tw, "\nFUNCTION\tQUOTA\tSLO\tINSTANCES\tQUEUED\tRUNNING\tSERVED\tON TIME\tREFUSED\tSHED\tFAULTS\tBACKED OFF")
	for _, f := range st.Functions {
		slo := "-"
		if f.SLO > 0 {
			slo = fmt.Sprintf("%s@p%g", f.SLO, f.Percentile)
		}
		backedOff := "-" // after repeated kernel faults: its requests answered 503 with Retry-After
		if f.BackedOff > 0 {
			backedOff = f.BackedOff.Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t%d\t%s\n", f.Name, mib(f.MemoryBytes), slo,
			f.Instances, f.Queued, f.Running, f.Served, f.OnTime, f.Refused, f.Shed, f.Faults, backedOff)
	}
	tw.Flush()
	sum := pool.Summarize(st.Functions)
	if st.SLO != nil {
		sum = *st.SLO
	}
	fmt.Fprintf(w, "\nfunctions within SLO: %d/%d   requests within SLO: %d/%d   refused: %d\n", sum.FunctionsMet,
		sum.Functions, sum.OnTime, sum.Requests, sum.Refused)
	if ov := st.Overload; ov != nil {
		shedding := "none"
		if len(ov.Shedding) > 0 {
			shedding = strings.Join(ov.Shedding, ",")
		}
		fmt.Fprintf(w, "overload control: %s, demand %.2f of %.0f GPUs, shedding: %s\n", ov.Setting, ov.Demand,
			ov.Capacity, shedding)
	}
}

func mib(b uint64) string { return fmt.Sprintf("%dMi", b>>20) }
