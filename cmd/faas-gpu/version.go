package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version and commit are set with -ldflags "-X main.version=... -X main.commit=..." by make build.
var (
	version = "dev"
	commit  = "unknown"
)

func runVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "faas-gpu %s (commit %s, %s)\n", version, commit, runtime.Version())
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/openfaas/faas-provider", "github.com/nats-io/nats.go", "github.com/nats-io/nats-server/v2":
				fmt.Fprintf(stdout, "  %s %s\n", d.Path, d.Version)
			}
		}
	}
	return nil
}
