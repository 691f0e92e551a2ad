package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
)

// sandboxFlags are the flags of the local backend's function sandbox, shared by `up` and `provider`.
type sandboxFlags struct {
	mode string
	ids  string
}

func (f *sandboxFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mode, "sandbox", string(sandbox.ModeAuto),
		"isolate every function in namespaces of its own (mount, pid, ipc, uts; user when not root), under its "+
			"own user id when root: auto (where the kernel allows it, else run functions unisolated with a loud "+
			"warning), required (refuse to start where it cannot), off")
	fs.StringVar(&f.ids, "sandbox-ids", sandbox.IDRange{First: sandbox.DefaultFirstID, Count: sandbox.DefaultIDCount}.String(),
		"FIRST:COUNT: as root, the group FIRST may connect to the platform's sockets and every function runs as "+
			"its own user and group among FIRST+1 .. FIRST+COUNT-1 (ids no account of the machine uses)")
}

func (f *sandboxFlags) validate() error {
	if _, err := sandbox.ParseMode(f.mode); err != nil {
		return usageError{fmt.Errorf("-sandbox %w", err)}
	}
	if _, err := sandbox.ParseIDRange(f.ids); err != nil {
		return usageError{fmt.Errorf("-sandbox-ids %w", err)}
	}
	return nil
}

// open probes the kernel and says, loudly when functions are not isolated, what the sandbox isolates.
func (f *sandboxFlags) open(ctx context.Context, log *slog.Logger) (*sandbox.Sandbox, error) {
	mode, _ := sandbox.ParseMode(f.mode)  // validated
	ids, _ := sandbox.ParseIDRange(f.ids) // validated
	sb, err := sandbox.New(ctx, sandbox.Config{Mode: mode, IDs: ids})
	if err != nil {
		return nil, fmt.Errorf("-sandbox %s: %w (use -sandbox auto to run functions unisolated)", mode, err)
	}
	r := sb.Report()
	switch {
	case r.Isolated:
		log.Info("functions are sandboxed", "namespaces", r.Namespaces, "ids", r.IDs, "shared", r.Exposed)
	case mode == sandbox.ModeOff:
		log.Warn("FUNCTIONS ARE NOT ISOLATED (-sandbox off): every function runs as this process's user and can "+
			"read its files, its environment and other functions' secrets, signal it and replace its sockets",
			"exposed", r.Exposed)
	default:
		log.Error("FUNCTIONS ARE NOT ISOLATED: this kernel refuses the namespaces a sandbox needs; every function "+
			"runs as this process's user (-sandbox required refuses to start instead)", "reason", r.Reason,
			"exposed", r.Exposed)
	}
	return sb, nil
}

// sandboxFile, in up's state dir, holds the sandbox's report (JSON) for `faas-gpu pool`.
const sandboxFile = "sandbox.json"

// writeSandboxReport writes r to <stateDir>/sandboxFile (readable by anyone who may read the state dir: it holds
// no secret).
func writeSandboxReport(stateDir string, r sandbox.Report) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(stateDir, "."+sandboxFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(stateDir, sandboxFile)); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	return nil
}

// readSandboxReport reads the report up wrote in dir; ok is false when there is none.
func readSandboxReport(dir string) (r sandbox.Report, ok bool) {
	raw, err := os.ReadFile(filepath.Join(dir, sandboxFile))
	if err != nil {
		return r, false
	}
	return r, json.Unmarshal(raw, &r) == nil
}

// warnUnreachableSockets says, loudly, which of the gpuserver's sockets functions with ids of their own cannot
// connect to (they get a socket's group when it is not root's and may read and write the socket), and how to fix
// it. Up gives its sockets the sandbox's group itself; a standalone gpuserver needs -socket-group.
func warnUnreachableSockets(sb *sandbox.Sandbox, log *slog.Logger, sockets ...string) {
	group, ok := sb.SocketGroup()
	if !ok {
		return // not root, or not sandboxed: functions run as this process's user, the sockets' owner
	}
	for _, p := range sockets {
		fi, err := os.Stat(p)
		if err != nil {
			continue // not started yet: the gpuserver may start after the provider
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && st.Gid != 0 && fi.Mode()&0o060 == 0o060 {
			continue
		}
		log.Error("sandboxed GPU functions cannot connect to the gpuserver's socket: it is not group-readable and "+
			"-writable for a group other than root's; start the gpuserver with -socket-group "+
			strconv.FormatUint(uint64(group), 10)+" (the sandbox's group, the first of -sandbox-ids), or run "+
			"this provider with -sandbox off", "socket", p, "mode", fi.Mode().Perm())
	}
}
