package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
)

// gib is the unit of the bill's memory columns: GiB-seconds.
const gib = 1 << 30

// runUsage prints the bill per function (package metering): GPU seconds, GPU memory and host memory GiB-seconds
// and requests, since a time or since the bill began, with the namespaces' totals.
func runUsage(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("usage", flag.ContinueOnError)
	stateDir := fs.String("state-dir", "./.faas-gpu", "state dir of the `faas-gpu up` to bill (its gpuserver.sock)")
	var gs readerFlags
	gs.register(fs)
	sinceFlag := fs.String("since", "", "bill from this time on: RFC 3339 (2026-01-02T15:04:05Z) or a duration back "+
		"from now (24h, 90m), rounded down to the hour; default: since the bill began")
	asJSON := fs.Bool("json", false, "print the bill as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	since, err := api.ParseSince(*sinceFlag, time.Now())
	if err != nil {
		return usageError{fmt.Errorf("-since: %w", err)}
	}
	if *stateDir == "" {
		return usageError{errors.New("-state-dir: must not be empty")}
	}
	c, err := gs.client(*stateDir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := c.Usage(ctx, since)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	printUsage(stdout, r)
	return nil
}

// printUsage prints a bill: one line per function, then one per namespace.
func printUsage(w io.Writer, r metering.Report) {
	fmt.Fprintf(w, "usage from %s to %s\n\n", r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339))
	if len(r.Functions) == 0 {
		fmt.Fprintln(w, "no GPU function has used anything yet")
		return
	}
	const header = "REQUESTS\tGPU SECONDS\tGPU MEMORY GiB-s\tHOST MEMORY GiB-s"
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FUNCTION\tNAMESPACE\t"+header)
	ns := map[string]*metering.Counters{}
	for _, u := range r.Functions {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", u.Function, u.Namespace, usageColumns(u.Counters))
		if ns[u.Namespace] == nil {
			ns[u.Namespace] = &metering.Counters{}
		}
		t := ns[u.Namespace]
		t.Requests += u.Requests
		t.GPUSeconds += u.GPUSeconds
		t.GPUMemoryByteSeconds += u.GPUMemoryByteSeconds
		t.HostMemoryByteSeconds += u.HostMemoryByteSeconds
	}
	tw.Flush()
	names := make([]string, 0, len(ns))
	for n := range ns {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\t"+header)
	for _, n := range names {
		fmt.Fprintf(tw, "%s\t%s\n", n, usageColumns(*ns[n]))
	}
	tw.Flush()
}

// usageColumns are a bill line's figures: requests, GPU seconds, GPU and host memory GiB-seconds.
func usageColumns(c metering.Counters) string {
	return fmt.Sprintf("%d\t%.3f\t%.3f\t%.3f", c.Requests, c.GPUSeconds, c.GPUMemoryByteSeconds/gib,
		c.HostMemoryByteSeconds/gib)
}
