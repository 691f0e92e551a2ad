package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// sessionEnv marks the bench's own re-execution in a session of its own (see ownSession).
const sessionEnv = "FAAS_GPU_REPLAY_SESSION"

// ownSession runs this bench again, with the same arguments, as the leader of a new session, so that it and its
// client get an autogroup of their own (the kernel's scheduler shares the CPUs between autogroups first, and a
// process's nice counts only inside its autogroup), and returns its result. It returns handled false in that
// re-executed bench itself.
func ownSession(ctx context.Context, args []string, stdout, stderr io.Writer) (handled bool, err error) {
	if os.Getenv(sessionEnv) != "" {
		return false, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return true, fmt.Errorf("-nice: the bench's own executable: %w", err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), sessionEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return true, fmt.Errorf("-nice: start the bench in a session of its own: %w", err)
	}
	done := make(chan struct{})
	go func() { // a new session does not get the terminal's interrupt: pass it on
		select {
		case <-ctx.Done():
			_ = cmd.Process.Signal(os.Interrupt)
		case <-done:
		}
	}()
	err = cmd.Wait()
	close(done)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return true, exitCode(exit.ExitCode())
	}
	return true, err
}

// exitCode is the re-executed bench's exit status, passed on by main (it has printed its own error).
type exitCode int

func (e exitCode) Error() string { return "exit status " + strconv.Itoa(int(e)) }

// setNice gives every thread of this process (and so the threads and the client it starts later, which inherit
// it) and its autogroup the nice value nice. Raising the priority (nice < 0) needs root or CAP_SYS_NICE: the error
// then says so.
func setNice(nice int) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("-nice: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil {
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
				return fmt.Errorf("-nice %d: not permitted (%w): raising the priority needs root or CAP_SYS_NICE; "+
					"-nice 0 runs at the inherited priority, and the report says so", nice, err)
			}
			return fmt.Errorf("-nice %d: thread %d: %w", nice, tid, err)
		}
	}
	// The autogroup is this bench's own (ownSession): its nice weighs it against the machine's other sessions.
	if err := os.WriteFile("/proc/self/autogroup", []byte(strconv.Itoa(nice)), 0); err != nil &&
		!errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("-nice %d: autogroup: %w", nice, err)
	}
	return nil
}

// machineLoad is /proc/loadavg's 1-minute load average and its runnable tasks now (this bench's included).
type machineLoad struct {
	Load1    float64
	Runnable int
	Line     string // the three averages and runnable/total, as read
}

func readLoad() (machineLoad, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return machineLoad{}, err
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return machineLoad{}, fmt.Errorf("/proc/loadavg: %q", b)
	}
	l, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return machineLoad{}, fmt.Errorf("/proc/loadavg: %q", b)
	}
	r, _, _ := strings.Cut(f[3], "/")
	n, _ := strconv.Atoi(r)
	return machineLoad{Load1: l, Runnable: n, Line: strings.Join(f[:4], " ")}, nil
}

// errTooLoaded is the refusal to run on a machine whose other work would move the figures.
var errTooLoaded = errors.New("the machine is too loaded for figures that mean anything")

// checkLoad refuses (errTooLoaded) when the 1-minute load average is above maxLoad, unless force; forced, it
// returns the label the report carries. maxLoad <= 0 checks nothing.
func checkLoad(l machineLoad, maxLoad float64, force bool) (label string, err error) {
	if maxLoad <= 0 || l.Load1 <= maxLoad {
		return "", nil
	}
	msg := fmt.Sprintf("load average %.2f (runnable/tasks %s) is above -max-load %.2f: the client and the "+
		"gpuserver need a CPU each, and the machine's other work takes them (on a loaded 2-core VM every pass ran "+
		"up to 4x slower and unpinned ratios moved by 0.07)", l.Load1, strings.Fields(l.Line)[3], maxLoad)
	if !force {
		return "", fmt.Errorf("%w: %s; wait for a quieter machine, or run with -force (the report is then "+
			"labelled as a loaded run)", errTooLoaded, msg)
	}
	return "**Loaded run (-force)**: " + msg + ". These figures are not comparable with a quiet run's.", nil
}

// statedSpread is how far apart two runs the load check accepts may put one pass's shim/native (and shim/H100
// native): the largest difference seen between accepted runs was 0.007 (ac09ae8 at load 0.6-1.3 against b6bf633,
// pinned at nice -15 at load 7-12), and 0.018 between the committed run and an outside rerun before the
// bench set its own conditions. A run whose own repeats spread wider says so in its report.
const statedSpread = 0.02

// spreadNote is the report's sentence on the spread: the stated one, and this run's widest range over its repeats.
func spreadNote(repeat int, rs []result) string {
	widest, at := 0.0, ""
	for _, r := range rs {
		if w := r.RatioMax - r.RatioMin; w >= widest {
			widest, at = w, fmt.Sprintf("%s b%d", r.Model, r.Batch)
		}
	}
	msg := fmt.Sprintf("**Spread**: another run this bench accepts (load at most -max-load, its own priority and "+
		"pinning) gives each pass's shim/native and shim/H100 native within ±%.2f of these (the largest difference "+
		"between accepted runs so far: 0.007; test/bench/replay statedSpread).", statedSpread)
	if repeat < 2 || len(rs) == 0 {
		return msg + " One run per trace: no range of its own to check it against."
	}
	msg += fmt.Sprintf(" This run's %d repeats spread by at most %.3f (%s)", repeat, widest, at)
	if widest > statedSpread {
		return msg + fmt.Sprintf(", **wider than the stated spread: these figures are not reproducible to ±%.2f**.",
			statedSpread)
	}
	return msg + "."
}
