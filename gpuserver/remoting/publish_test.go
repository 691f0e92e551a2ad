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

// publishServer is a server of function "f" (token "tok") whose sessions execute through h.
func publishServer(t *testing.T, cfg Config, h Handler) *Server {
	t.Helper()
	cfg.Functions = registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}}
	cfg.NewHandler = func(context.Context, SessionInfo) (Handler, error) { return h, nil }
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// publishClient is the shim's early_publish client of function "f": it issues its launches without synchronizing,
// says "issued", and synchronizes when told "go" on stdin.
type publishClient struct {
	t      *testing.T
	in     io.WriteCloser
	out    *bufio.Reader
	stderr strings.Builder
}

// startEarlyPublish starts early_publish with launches launches against the server srv serves, and returns once it
// has said it issued them; the client is ended (stdin closed, waited for) when the test ends.
func startEarlyPublish(t *testing.T, srv *Server, launches string) *publishClient {
	t.Helper()
	sock := serve(t, srv)
	lib := shimDir(t)
	cmd := exec.Command(filepath.Join(lib, "early_publish"), launches)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "FAAS_GPU_REMOTING_SOCKET="+sock, "FAAS_GPU_FUNCTION=f",
		"FAAS_GPU_TOKEN=tok")
	c := &publishClient{t: t}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(); _ = cmd.Wait() })
	c.in, c.out = in, bufio.NewReader(outp)
	c.expect("issued\n")
	return c
}

// waitFor fails the test with what unless cond holds within 20 seconds, checking every millisecond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}

// expect fails the test unless the client's next line is line.
func (c *publishClient) expect(line string) {
	c.t.Helper()
	if got, err := c.out.ReadString('\n'); err != nil || got != line {
		c.t.Fatalf("client: %q %v: %s", got, err, c.stderr.String())
	}
}

// sync tells the client to synchronize and fails the test unless its synchronize succeeds.
func (c *publishClient) sync() {
	c.t.Helper()
	if _, err := io.WriteString(c.in, "go\n"); err != nil {
		c.t.Fatal(err)
	}
	c.expect("synced 0\n")
}

// TestAsyncRecordsReachTheServerBeforeTheSynchronize: fire-and-forget launches are executed by the server while
// the client has not synchronized yet (it blocks on stdin until the server has seen them all), none of them late.
// A shim that held records back until a synchronize, or until a batch filled, fails here.
func TestAsyncRecordsReachTheServerBeforeTheSynchronize(t *testing.T) {
	var launches, syncs atomic.Int64
	srv := publishServer(t, Config{}, launchCounter{launches: &launches, syncs: &syncs})
	const n = 10
	c := startEarlyPublish(t, srv, "10")
	for deadline := time.Now().Add(20 * time.Second); launches.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server executed %d of the %d launches the client issued before synchronizing", launches.Load(), n)
		}
	}
	if syncs.Load() != 0 {
		t.Fatal("the client synchronized before it was told to")
	}
	c.sync()
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
	srv := publishServer(t, Config{Spin: 50 * time.Microsecond, BoundSpin: time.Minute},
		boundCounter{launchCounter{launches: &launches, syncs: &syncs}, &bound})
	c := startEarlyPublish(t, srv, "1")
	waitFor(t, "the launch never reached the server", func() bool { return launches.Load() >= 1 })
	time.Sleep(50 * time.Millisecond) // the client is silent: a thousand times the unbound spin time
	if n := srv.Stats().Sleeps; n != 0 {
		t.Fatalf("the session slept %d times while its function held a binding", n)
	}
	bound.Store(false)
	waitFor(t, "the session never slept after the binding was released", func() bool { return srv.Stats().Sleeps != 0 })
	if st := srv.Stats(); st.BoundPoll < 50*time.Millisecond {
		t.Fatalf("bound polling counted %v, the session polled at least 50ms", st.BoundPoll)
	}
	c.sync()
}

// TestWakeStartsPollingWhenBound: a session asleep on its socket while its function is unbound starts polling as
// soon as the function is bound and Wake is called, without a record from the client: it polls for BoundSpin, then
// sleeps again.
func TestWakeStartsPollingWhenBound(t *testing.T) {
	var launches, syncs atomic.Int64
	var bound atomic.Bool
	srv := publishServer(t, Config{Spin: 50 * time.Microsecond, BoundSpin: 20 * time.Millisecond, IdleRelease: time.Hour},
		boundCounter{launchCounter{launches: &launches, syncs: &syncs}, &bound})
	c := startEarlyPublish(t, srv, "1")
	waitFor(t, "the launch never reached the server", func() bool { return launches.Load() == 1 })
	waitFor(t, "the unbound session never slept", func() bool { return srv.Stats().Sleeps >= 1 })
	slept := srv.Stats().Sleeps
	bound.Store(true)
	srv.Wake("f")
	// it polls for BoundSpin, then sleeps again: a sleep it could not have entered without waking
	waitFor(t, "the session did not wake when its function was bound", func() bool { return srv.Stats().Sleeps > slept })
	if p := srv.Stats().BoundPoll; p < 20*time.Millisecond {
		t.Fatalf("the woken session polled %v, want its BoundSpin (20ms)", p)
	}
	c.sync()
}
