package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// streamChunk is chunk i of the slowstream handler's ?chunks=N&size=B: float32 c_j = i + j.
func streamChunk(i, size int) []byte {
	out := make([]byte, size)
	for j := 0; j < size/4; j++ {
		binary.LittleEndian.PutUint32(out[4*j:], math.Float32bits(float32(i+j)))
	}
	return out
}

// vectorAdd is a request of functions/vector-add and its exact answer.
func vectorAdd(k int) (body []byte, want string) {
	a, b, c := make([]string, 3), make([]string, 3), make([]string, 3)
	for i := range 3 {
		a[i], b[i], c[i] = fmt.Sprint(k+i), fmt.Sprint(10*(i+1)), fmt.Sprintf("%d.0", k+i+10*(i+1))
	}
	return []byte(`{"a":[` + strings.Join(a, ",") + `],"b":[` + strings.Join(b, ",") + `]}`),
		`{"c": [` + strings.Join(c, ", ") + `]}`
}

func postTo(t *testing.T, f *templateFunction, query string, body []byte) (int, string) {
	t.Helper()
	code, out, err := post(f, query, body)
	if err != nil {
		t.Fatalf("invoke: %v\n%s", err, f.stderr)
	}
	return code, out
}

// post is postTo for a goroutine of its own (which must not end its test).
func post(f *templateFunction, query string, body []byte) (int, string, error) {
	resp, err := http.Post(f.url+query, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(out)), err
}

// TestSlowStreamReadersDoNotHoldTheGPU: on a node of one GPU, a function streams 32 MiB, each MiB added on the GPU
// as it is yielded (the gpu-python template, through the shim and its tenant's executor process), to a client that
// reads the first MiB and then nothing. The generation ends and its binding is released while the client still
// reads nothing; another tenant's caller is then served (exactly) while the slow client has not read on, and the slow
// client, reading the rest at 10 MiB/s, gets every byte and the stream's end. A client that reads nothing at all
// from a template whose stream buffer (FAAS_GPU_STREAM_BUFFER_BYTES) is 1 MiB has its stream cut: the binding is
// released, the client reads a correct prefix and then an error, never a complete answer. Before, the template
// wrote each chunk in the generator's thread: a slow client kept the binding (and the only GPU) for as long as it
// took to read, and the other caller's acquire timed out (504).
func TestSlowStreamReadersDoNotHoldTheGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the gpu-python template through the shim and executor processes")
	}
	testkit.NeedPython(t)
	testkit.Shim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc, _ := tenantConfig(t)
	s := startOneGPU(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc})
	defer stop(t, s)
	for _, fn := range []string{"stream.ns1", "vector-add.ns2"} {
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	vaddDir, err := filepath.Abs("../../functions/vector-add")
	if err != nil {
		t.Fatal(err)
	}
	streamer := startTemplateFunction(t, s, "stream.ns1", "testdata/slowstream", "VECTOR_ADD_DIR="+vaddDir,
		"FAAS_GPU_STREAM_BUFFER_BYTES=67108864")
	tight := startTemplateFunction(t, s, "stream.ns1", "testdata/slowstream", "VECTOR_ADD_DIR="+vaddDir,
		"FAAS_GPU_STREAM_BUFFER_BYTES=1048576")
	other := startTemplateFunction(t, s, "vector-add.ns2", "../../functions/vector-add",
		"FAAS_GPU_ACQUIRE_TIMEOUT_MS=15000")
	body, want := vectorAdd(1)
	if code, out := postTo(t, other, "", body); code != 200 || out != want {
		t.Fatalf("the other function before the stream: %d %s\n%s", code, out, other.stderr)
	}
	const chunks, size = 32, 1 << 20
	query := fmt.Sprintf("?chunks=%d&size=%d", chunks, size)
	served := func() int64 { return functionStatus(ctx, t, s, "stream.ns1").Served }
	released := func(what string, served0 int64) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, what, func() bool {
			st := functionStatus(ctx, t, s, "stream.ns1")
			return st.Running == 0 && st.Served == served0+1
		})
	}

	// A slow client: the first MiB, then nothing until the other caller was served, then 1 MiB per 100 ms.
	start := time.Now()
	served0 := served()
	resp, err := http.Get(streamer.url + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	chunk := make([]byte, size)
	if _, err := io.ReadFull(resp.Body, chunk); err != nil || !bytes.Equal(chunk, streamChunk(0, size)) {
		t.Fatalf("the first chunk: %v (equal: %v)\n%s", err, bytes.Equal(chunk, streamChunk(0, size)), streamer.stderr)
	}
	released("the stream's binding released at the end of its generation, its client reading nothing", served0)
	otherStart := time.Now()
	body, want = vectorAdd(2)
	if code, out := postTo(t, other, "", body); code != 200 || out != want {
		t.Fatalf("the other function while the slow client reads nothing: %d %s\n%s", code, out, other.stderr)
	}
	otherTook := time.Since(otherStart)
	for i := 1; i < chunks; i++ {
		time.Sleep(100 * time.Millisecond)
		if _, err := io.ReadFull(resp.Body, chunk); err != nil || !bytes.Equal(chunk, streamChunk(i, size)) {
			t.Fatalf("chunk %d of the slow read: %v (equal: %v)\n%s", i, err, bytes.Equal(chunk, streamChunk(i, size)),
				streamer.stderr)
		}
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("the end of the slow read: %d bytes more, %v; want its end (the final chunk)", len(rest), err)
	}
	slowRead := time.Since(start)
	if otherTook > slowRead/2 {
		t.Fatalf("the other caller took %s, the slow read %s: want well below", otherTook, slowRead)
	}
	t.Logf("slow read of %d MiB: %s; the other tenant's caller served in %s meanwhile", chunks*size>>20,
		slowRead.Round(time.Millisecond), otherTook.Round(time.Millisecond))

	// A client that reads nothing from a template that lets 1 MiB wait: its stream is cut and its binding released.
	served0 = served()
	resp2, err := http.Get(tight.url + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	released("the binding of a stream whose client reads nothing beyond the buffer", served0)
	got, err := io.ReadAll(resp2.Body)
	if err == nil || len(got) >= chunks*size {
		t.Fatalf("a stream cut for a client too slow: %d bytes, %v; want fewer than %d and an error", len(got), err,
			chunks*size)
	}
	for i := 0; i*size < len(got); i++ {
		if part := got[i*size : min(len(got), (i+1)*size)]; !bytes.Equal(part, streamChunk(i, size)[:len(part)]) {
			t.Fatalf("chunk %d of a cut stream differs from what was generated", i)
		}
	}
	if !strings.Contains(tight.stderr.String(), "FAAS_GPU_STREAM_BUFFER_BYTES") {
		t.Errorf("the template did not log why the stream was cut:\n%s", tight.stderr)
	}
	body, want = vectorAdd(3)
	if code, out := postTo(t, other, "", body); code != 200 || out != want {
		t.Fatalf("the other function after the cut stream: %d %s", code, out)
	}
	t.Logf("cut stream: %d of %d bytes reached the client", len(got), chunks*size)
}

// TestOtherCallersServedAfterMaxHold: a request of a function (the gpu-python template through the shim, its
// tenant's executor process) holds its binding past the maximum hold (1 s); once the hold has ended it, five other
// requests of the same function are answered 200 with exact sums while the holder is still in its handler, the
// holder is answered 503 (its binding broke), and the function serves on. Before, the function's work was refused
// until the holder released, and every other caller was answered 500 meanwhile.
func TestOtherCallersServedAfterMaxHold(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the gpu-python template through the shim and executor processes")
	}
	testkit.NeedPython(t)
	testkit.Shim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc, _ := tenantConfig(t)
	s := startOneGPU(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc, MaxBindingHold: time.Second})
	defer stop(t, s)
	if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: "hold.ns1", MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	vaddDir, err := filepath.Abs("../../functions/vector-add")
	if err != nil {
		t.Fatal(err)
	}
	f := startTemplateFunction(t, s, "hold.ns1", "testdata/slowstream", "VECTOR_ADD_DIR="+vaddDir)
	body, want := vectorAdd(0)
	if code, out := postTo(t, f, "", body); code != 200 || out != want {
		t.Fatalf("before the hold: %d %s\n%s", code, out, f.stderr)
	}
	gate := filepath.Join(t.TempDir(), "gate")
	type answer struct {
		code int
		out  string
		err  error
	}
	held := make(chan answer, 1)
	go func() {
		code, out, err := post(f, "?gate="+gate, body)
		held <- answer{code, out, err}
	}()
	defer func() { // the holder is answered before its template stops, whatever the test found
		_ = os.WriteFile(gate, nil, 0o600)
	}()
	testkit.Eventually(t, 30*time.Second, "the holder's binding ended by the maximum hold", func() bool {
		return s.pool.HoldsExpired() == 1
	})
	for k := 1; k <= 5; k++ {
		body, want := vectorAdd(k)
		if code, out := postTo(t, f, "", body); code != 200 || out != want {
			t.Fatalf("caller %d after the hold ended, the holder still in its handler: %d %s, want 200 %s\n%s", k, code,
				out, want, f.stderr)
		}
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-held:
		if a.err != nil || a.code != 503 || strings.Contains(a.out, `"c"`) {
			t.Fatalf("the holder: %d %s %v, want 503 without a result", a.code, a.out, a.err)
		}
	case <-ctx.Done():
		t.Fatal("the holder was never answered")
	}
	body, want = vectorAdd(9)
	if code, out := postTo(t, f, "", body); code != 200 || out != want {
		t.Fatalf("after the holder's release: %d %s", code, out)
	}
}
