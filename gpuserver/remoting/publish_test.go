package remoting

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// launchCounter counts the launches and synchronizes its session executes.
type launchCounter struct {
	UnimplementedHandler
	launches, syncs *atomic.Int64
}

func (c launchCounter) CuLaunchKernel(_ context.Context, _ uint64, _, _, _, _, _, _, _ uint32, _ uint64, _ []byte,
	_ uint64) Result {
	c.launches.Add(1)
	return ResultSuccess
}

func (c launchCounter) CuCtxSynchronize(context.Context) Result {
	c.syncs.Add(1)
	return ResultSuccess
}

// TestAsyncRecordsReachTheServerBeforeTheSynchronize: fire-and-forget launches are executed by the server while
// the client has not synchronized yet (it blocks on stdin until the server has seen them all), none of them late.
// A shim that held records back until a synchronize, or until a batch filled, fails here.
func TestAsyncRecordsReachTheServerBeforeTheSynchronize(t *testing.T) {
	var launches, syncs atomic.Int64
	srv, err := NewServer(Config{Functions: registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}},
		NewHandler: func(context.Context, SessionInfo) (Handler, error) {
			return launchCounter{launches: &launches, syncs: &syncs}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	sock := serve(t, srv)
	lib := shimDir(t)
	const n = 10
	cmd := exec.Command(filepath.Join(lib, "early_publish"), "10")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "FAAS_GPU_REMOTING_SOCKET="+sock, "FAAS_GPU_FUNCTION=f",
		"FAAS_GPU_TOKEN=tok")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	out := bufio.NewReader(outp)
	if line, err := out.ReadString('\n'); err != nil || line != "issued\n" {
		t.Fatalf("client: %q %v: %s", line, err, stderr.String())
	}
	for deadline := time.Now().Add(20 * time.Second); launches.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server executed %d of the %d launches the client issued before synchronizing", launches.Load(), n)
		}
	}
	if syncs.Load() != 0 {
		t.Fatal("the client synchronized before it was told to")
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := out.ReadString('\n'); err != nil || line != "synced 0\n" {
		t.Fatalf("client: %q %v: %s", line, err, stderr.String())
	}
	if st := srv.Stats(); st.LateRecords != 0 || st.Records != n+1 {
		t.Fatalf("%d records executed, %d late; want %d, none late", st.Records, st.LateRecords, n+1)
	}
}

// boundCounter is a launchCounter whose function holds a binding while bound is set.
type boundCounter struct {
	launchCounter
	bound *atomic.Bool
}

func (b boundCounter) Bound() bool { return b.bound.Load() }

// TestSessionPollsWithoutSleepingWhileBound: while the function holds a binding, its session polls the ring
// between the client's calls instead of sleeping on the socket (no sleep in a pause a thousand times the unbound
// spin time); once the binding is released it sleeps again, and its polling time is counted.
func TestSessionPollsWithoutSleepingWhileBound(t *testing.T) {
	var launches, syncs atomic.Int64
	var bound atomic.Bool
	bound.Store(true)
	srv, err := NewServer(Config{Functions: registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}},
		Spin: 50 * time.Microsecond, BoundSpin: time.Minute,
		NewHandler: func(context.Context, SessionInfo) (Handler, error) {
			return boundCounter{launchCounter{launches: &launches, syncs: &syncs}, &bound}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	sock := serve(t, srv)
	lib := shimDir(t)
	cmd := exec.Command(filepath.Join(lib, "early_publish"), "1")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "FAAS_GPU_REMOTING_SOCKET="+sock, "FAAS_GPU_FUNCTION=f",
		"FAAS_GPU_TOKEN=tok")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	out := bufio.NewReader(outp)
	if line, err := out.ReadString('\n'); err != nil || line != "issued\n" {
		t.Fatalf("client: %q %v", line, err)
	}
	for deadline := time.Now().Add(20 * time.Second); launches.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the launch never reached the server")
		}
	}
	time.Sleep(50 * time.Millisecond) // the client is silent: a thousand times the unbound spin time
	if n := srv.Stats().Sleeps; n != 0 {
		t.Fatalf("the session slept %d times while its function held a binding", n)
	}
	bound.Store(false)
	for deadline := time.Now().Add(20 * time.Second); srv.Stats().Sleeps == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the session never slept after the binding was released")
		}
	}
	if st := srv.Stats(); st.BoundPoll < 50*time.Millisecond {
		t.Fatalf("bound polling counted %v, the session polled at least 50ms", st.BoundPoll)
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := out.ReadString('\n'); err != nil || line != "synced 0\n" {
		t.Fatalf("client: %q %v", line, err)
	}
}

// TestWakeStartsPollingWhenBound: a session asleep on its socket while its function is unbound starts polling as
// soon as the function is bound and Wake is called, without a record from the client: it polls for BoundSpin, then
// sleeps again.
func TestWakeStartsPollingWhenBound(t *testing.T) {
	var launches, syncs atomic.Int64
	var bound atomic.Bool
	srv, err := NewServer(Config{Functions: registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}},
		Spin: 50 * time.Microsecond, BoundSpin: 20 * time.Millisecond, IdleRelease: time.Hour,
		NewHandler: func(context.Context, SessionInfo) (Handler, error) {
			return boundCounter{launchCounter{launches: &launches, syncs: &syncs}, &bound}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	sock := serve(t, srv)
	lib := shimDir(t)
	cmd := exec.Command(filepath.Join(lib, "early_publish"), "1")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "FAAS_GPU_REMOTING_SOCKET="+sock, "FAAS_GPU_FUNCTION=f",
		"FAAS_GPU_TOKEN=tok")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	out := bufio.NewReader(outp)
	if line, err := out.ReadString('\n'); err != nil || line != "issued\n" {
		t.Fatalf("client: %q %v", line, err)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	waitFor("the launch never reached the server", func() bool { return launches.Load() == 1 })
	waitFor("the unbound session never slept", func() bool { return srv.Stats().Sleeps >= 1 })
	slept := srv.Stats().Sleeps
	bound.Store(true)
	srv.Wake("f")
	// it polls for BoundSpin, then sleeps again: a sleep it could not have entered without waking
	waitFor("the session did not wake when its function was bound", func() bool { return srv.Stats().Sleeps > slept })
	if p := srv.Stats().BoundPoll; p < 20*time.Millisecond {
		t.Fatalf("the woken session polled %v, want its BoundSpin (20ms)", p)
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := out.ReadString('\n'); err != nil || line != "synced 0\n" {
		t.Fatalf("client: %q %v", line, err)
	}
}
