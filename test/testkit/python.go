package testkit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
)

// Python is a Python process a test drives line by line: a command on its stdin, answer lines on its stdout. The
// drivers that run through the shim (a function process without the template: the CUDA driver API through ctypes,
// functions/vector-add/cudadrv.py) speak this way.
type Python struct {
	t      testing.TB
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string // the process's stdout, line by line; closed when it ends
	ended  error       // why the lines ended (nil at the end of the output); read after lines is closed
	stderr *Buffer
	wait   sync.Once // cmd.Wait, once
}

// ErrEnded: the process ended before the line awaited.
var ErrEnded = errors.New("the Python process ended")

// maxLine is the longest line a driver may answer with (a model's output as JSON).
const maxLine = 64 << 20

// StartPython starts python3 running script, with env added to the test's environment (and
// PYTHONDONTWRITEBYTECODE=1); the test is skipped where python3 is missing. The process ends with the test: its
// stdin is closed, and it is killed if it has not ended 10s later.
func StartPython(t testing.TB, script string, env ...string) *Python {
	t.Helper()
	NeedPython(t)
	cmd := exec.Command("python3", "-c", script)
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), env...)
	p := &Python{t: t, cmd: cmd, stderr: &Buffer{}, lines: make(chan string, 64)}
	cmd.Stderr = p.stderr
	var err error
	if p.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go p.read(stdout) // ends with the process's output
	t.Cleanup(p.stop)
	return p
}

// read passes the process's output on, line by line, until it ends.
func (p *Python) read(stdout io.Reader) {
	out := bufio.NewScanner(stdout)
	out.Buffer(nil, maxLine)
	for out.Scan() {
		p.lines <- out.Text()
	}
	p.ended = out.Err()
	close(p.lines)
}

func (p *Python) stop() {
	_ = p.in.Close()
	done := make(chan struct{})
	go func() { p.reap(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	for range p.lines { // what it wrote last, unread
	}
}

// Send writes line to the process's stdin (an error when the process has ended).
func (p *Python) Send(line string) error {
	_, err := fmt.Fprintln(p.in, line)
	return err
}

// Line returns the next line the process wrote; false when it ended (Stderr says why).
func (p *Python) Line() (string, bool) {
	line, ok := <-p.lines
	return line, ok
}

// LineWithin is Line with a bound: an error wrapping ErrEnded when the process ended, another after d.
func (p *Python) LineWithin(d time.Duration) (string, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case line, ok := <-p.lines:
		if !ok {
			return "", fmt.Errorf("%w: %v", ErrEnded, p.ended)
		}
		return line, nil
	case <-timer.C:
		return "", fmt.Errorf("the Python process did not answer within %s\n%s", d, p.stderr)
	}
}

// Next is Line for a test that cannot go on without the line: the test fails, with the process's stderr, when the
// process ended.
func (p *Python) Next() string {
	p.t.Helper()
	line, ok := p.Line()
	if !ok {
		p.t.Fatalf("the Python process ended: %v\nstderr:\n%s", p.ended, p.stderr)
	}
	return line
}

// Stderr is what the process wrote to its standard error so far.
func (p *Python) Stderr() string { return p.stderr.String() }

// Process is the running process (its pid, to kill it).
func (p *Python) Process() *os.Process { return p.cmd.Process }

// Close closes the process's stdin (a driver ends at the end of its input) and waits until it has exited.
func (p *Python) Close() {
	_ = p.in.Close()
	p.reap()
}

// Kill kills the process and waits until it has exited.
func (p *Python) Kill() {
	_ = p.cmd.Process.Kill()
	p.reap()
}

// reap waits for the process to exit (once).
func (p *Python) reap() { p.wait.Do(func() { _ = p.cmd.Wait() }) }

// NeedPython skips the test where python3 is missing.
func NeedPython(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
}

// RepoRoot is the repository's root folder: the nearest folder above the test's holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's folder")
		}
		dir = parent
	}
}

// Shim builds the shim (make -s -C shim: a no-op when it is up to date) and returns the folder holding its
// libcuda.so.1.
func Shim(t testing.TB) string {
	t.Helper()
	shim := filepath.Join(RepoRoot(t), "shim")
	if out, err := exec.Command("make", "-s", "-C", shim).CombinedOutput(); err != nil {
		t.Fatalf("make -C shim: %v\n%s", err, out)
	}
	return filepath.Join(shim, "build")
}

// ShimEnv is the environment of a function process on the shim (lib, from Shim): the shim first on
// LD_LIBRARY_PATH, the gpuserver's remoting socket, the function's name and token.
func ShimEnv(lib, remotingSocket, function, token string) []string {
	return []string{"LD_LIBRARY_PATH=" + lib, contract.EnvRemotingSocket + "=" + remotingSocket,
		contract.EnvFunction + "=" + function, contract.EnvToken + "=" + token}
}
