// Command faas-gpu runs every part of faas-gpu: `up` (everything on one machine), or one component at a time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/faas-gpu/faas-gpu/gpuserver/tenantexec"
	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
)

// command is one subcommand: it parses its own flags from args and runs until ctx ends.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"up":           {"run everything on this machine: NATS JetStream, gpuserver, provider, queue worker", runUp},
		"provider":     {"run the faas-provider API (local, kubernetes or knative backend)", runProvider},
		"queue-worker": {"run the queue worker for asynchronous invocations", runQueueWorker},
		"gpuserver":    {"run the node's gpuserver (GPU pool, swapping, remoting)", runGPUServer},
		"sim":          {"replay a trace through the gpuserver's policies on a simulated node", runSim},
		"replay":       {"replay a trace window on a real up (timed virtual GPU) beside the simulator's prediction", runReplay},
		"pool":         {"show the GPU pool and queues of a running gpuserver", runPool},
		"usage":        {"print the bill per function: GPU seconds, GPU and host memory GiB-seconds", runUsage},
		"version":      {"print the version", runVersion},
	}
}

func main() {
	if sandbox.IsInit() { // this binary started again as a function sandbox's init (package sandbox)
		os.Exit(sandbox.RunInit())
	}
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

func run(argv []string, stdout, stderr io.Writer) int {
	cmds := commands()
	name := ""
	args := []string{}
	// The stock OpenFaaS chart starts its provider as ./faas-netes: answer to that name as the provider.
	if base := filepath.Base(argv[0]); base == "faas-netes" {
		name, args = "provider", argv[1:]
	} else if len(argv) > 1 {
		name, args = argv[1], argv[2:]
	}
	if name == tenantExecutorCommand { // hidden: started by the gpuserver, one per tenant, on its control socket (fd 3)
		return tenantexec.Main(stderr)
	}
	cmd, ok := cmds[name]
	if !ok {
		usage(stderr, cmds)
		if name == "" || name == "-h" || name == "--help" || name == "help" {
			return 0
		}
		fmt.Fprintf(stderr, "faas-gpu: unknown command %q\n", name)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, args, stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "faas-gpu %s: %v\n", name, err)
			return 2
		}
		slog.Error("faas-gpu "+name+" failed", "err", err)
		return 1
	}
	return 0
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "faas-gpu: serverless GPU inference for OpenFaaS and Knative")
	fmt.Fprintln(w, "\nusage: faas-gpu <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-13s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'faas-gpu <command> -h' for the flags of a command.")
}

// usageError is a bad flag or argument: the process exits 2 with the message, which names the flag.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// envName is the environment variable matching a flag: FAAS_GPU_ and the flag's name in upper case with
// underscores, e.g. --state-dir and FAAS_GPU_STATE_DIR.
func envName(flagName string) string {
	return "FAAS_GPU_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags parses args, then gives every flag not set on the command line the value of its environment variable
// (envName) when that is set and not empty, and turns errors into usageErrors that name the flag or the variable.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		f.Usage += " (env " + envName(f.Name) + ")"
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stderr)
			fs.PrintDefaults()
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := os.LookupEnv(envName(f.Name))
		if set[f.Name] || !ok || v == "" || envErr != nil {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = usageError{fmt.Errorf("invalid value %q for %s (flag -%s): %w", v, envName(f.Name), f.Name, err)}
		}
	})
	return envErr
}
