package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

func runPool(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("pool", flag.ContinueOnError)
	socket := fs.String("socket", "./.faas-gpu/gpuserver.sock", "Unix socket of the gpuserver API")
	url := fs.String("url", "", "TCP URL of the gpuserver API (instead of -socket), e.g. http://127.0.0.1:8090")
	asJSON := fs.Bool("json", false, "print the raw status as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c := client.New(*socket)
	if *url != "" {
		c = client.NewTCP(*url)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printPool(stdout, st)
	return nil
}

func printPool(w io.Writer, st pool.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "policy: %s\tqueued: %d\tswaps: none %d, nvlink %d, pcie %d\n\n", st.Policy, st.Queued,
		st.Swaps["none"], st.Swaps["nvlink"], st.Swaps["pcie"])
	fmt.Fprintln(tw, "GPU\tNAME\tBUSY\tHEALTHY\tMEMORY USED\tRESIDENT")
	for _, g := range st.GPUs {
		fmt.Fprintf(tw, "%d\t%s\t%v\t%v\t%s / %s\t%s\n", g.Index, g.Name, g.Busy, g.Healthy, mib(g.UsedBytes),
			mib(g.MemoryBytes), strings.Join(g.Resident, ","))
	}
	fmt.Fprintln(tw, "\nFUNCTION\tQUOTA\tSLO\tQUEUED\tRUNNING\tSERVED\tON TIME")
	for _, f := range st.Functions {
		slo := "-"
		if f.SLO > 0 {
			slo = fmt.Sprintf("%s@p%g", f.SLO, f.Percentile)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", f.Name, mib(f.MemoryBytes), slo, f.Queued, f.Running,
			f.Served, f.OnTime)
	}
	tw.Flush()
}

func mib(b uint64) string { return fmt.Sprintf("%dMi", b>>20) }
