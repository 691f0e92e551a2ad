package handoff

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestFrameLayout pins the header: both sides of the control socket are the same binary today, but a gpuserver and
// an executor of different builds must refuse each other, not misread each other.
func TestFrameLayout(t *testing.T) {
	b, err := Encode(KindAcquire, FlagReply|FlagError, 0x0102030405060708, Name{Function: "f"})
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	body := `{"function":"f"}`
	if HeaderSize != 24 || len(b) != 24+len(body) || string(b[24:]) != body {
		t.Fatalf("frame %q", b)
	}
	for _, c := range []struct {
		off  int
		got  uint64
		want uint64
	}{
		{0, uint64(le.Uint32(b[0:])), 0x4e544746},
		{4, uint64(le.Uint16(b[4:])), 1},
		{6, uint64(le.Uint16(b[6:])), 5},
		{8, uint64(le.Uint16(b[8:])), 33},
		{10, uint64(le.Uint16(b[10:])), 3},
		{12, uint64(le.Uint32(b[12:])), uint64(len(body))},
		{16, le.Uint64(b[16:]), 0x0102030405060708},
	} {
		if c.got != c.want {
			t.Errorf("offset %d: %#x, want %#x", c.off, c.got, c.want)
		}
	}
	if string(b[0:4]) != "FGTN" {
		t.Errorf("magic reads %q", b[0:4])
	}
	f, err := Decode(b)
	if err != nil || f.Kind != KindAcquire || f.ID != 0x0102030405060708 || f.Flags != FlagReply|FlagError {
		t.Fatalf("decode: %+v %v", f, err)
	}
}

// TestKindsArePinned: a kind's number is its meaning on the wire; renumbering one is an incompatible change.
func TestKindsArePinned(t *testing.T) {
	want := map[Kind]uint16{KindStart: 1, KindSession: 10, KindSessionEnded: 11, KindBorrow: 20, KindReturn: 21,
		KindReclaim: 22, KindRegister: 30, KindDeregister: 31, KindEndInit: 32, KindAcquire: 33, KindRelease: 34,
		KindSwapIn: 35, KindEvict: 36, KindMarkUnhealthy: 37, KindStatus: 38, KindWaitReady: 39,
		KindBindImplicit: 40, KindReleaseImplicit: 41, KindGPUFailed: 42, KindFault: 43, KindExpire: 44,
		KindReserveImages: 45, KindReleaseImages: 46, KindEvicted: 47}
	for k, n := range want {
		if uint16(k) != n {
			t.Errorf("kind %d, pinned as %d", k, n)
		}
	}
}

// TestBodiesArePinned: every body's JSON field names, as they travel.
func TestBodiesArePinned(t *testing.T) {
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		v    any
		want string
	}{
		{Start{Tenant: "namespace/a", Generation: 2, Device: Device{Kind: "cuda", CUDALibrary: "libcuda.so.1"},
			ChunkSize: 2 << 20, Chunks: []int{4}, WindowBase: 1 << 40, WindowSize: 1 << 38, RepositoryDir: "/r/a",
			GroupBytes: 4 << 20, LogLevel: "info", Functions: []Function{{Name: "f.a", Tenant: "namespace/a"}}},
			`{"tenant":"namespace/a","generation":2,"device":{"kind":"cuda","cuda_library":"libcuda.so.1"},` +
				`"chunk_size":2097152,"chunks":[4],"window_base":1099511627776,"window_size":274877906944,` +
				`"repository_dir":"/r/a","group_bytes":4194304,"log_level":"info","functions":[{"name":"f.a",` +
				`"tenant":"namespace/a"}]}`},
		{Started{PID: 7, GPUs: 1}, `{"pid":7,"gpus":1}`},
		{Session{ID: 3, Function: "f.a", Spec: pool.FunctionSpec{Name: "f.a", MemoryBytes: 1}, PID: 9, ShmSize: 4096},
			`{"id":3,"function":"f.a","spec":{"name":"f.a","memory_bytes":1},"pid":9,"shm_size":4096}`},
		{SessionEnded{ID: 3, Function: "f.a"}, `{"id":3,"function":"f.a"}`},
		{Borrow{GPU: 1, N: 2}, `{"gpu":1,"n":2}`},
		{Lent{GPU: 1, Indexes: []int{5, 6}, Size: 2 << 20}, `{"gpu":1,"indexes":[5,6],"size":2097152}`},
		{Return{GPU: 1, Indexes: []int{5}}, `{"gpu":1,"indexes":[5]}`},
		{Reclaim{GPU: 1, N: 2, Evict: true}, `{"gpu":1,"n":2,"evict":true}`},
		{Reclaimed{GPU: 1, Indexes: []int{5}}, `{"gpu":1,"indexes":[5]}`},
		{Acquire{Function: "f.a", GPU: 1, Source: -1, Binding: "b1", Request: true},
			`{"function":"f.a","gpu":1,"source":-1,"binding":"b1","request":true}`},
		{Released{Broken: &Error{Codes: []string{"executor.broken"}, Message: "m"}},
			`{"broken":{"codes":["executor.broken"],"message":"m"}}`},
		{SwapIn{Function: "f.a", GPU: 1, Source: 0}, `{"function":"f.a","gpu":1,"source":0}`},
		{Expire{Binding: "b1", GraceNS: 2e9, Cause: "c"}, `{"binding":"b1","grace_ns":2000000000,"cause":"c"}`},
		{Evict{Function: "f.a", GPU: 1}, `{"function":"f.a","gpu":1}`},
		{MarkUnhealthy{GPU: 1, Cause: "x"}, `{"gpu":1,"cause":"x"}`},
		{Bound{GPU: 1, Binding: "i1"}, `{"gpu":1,"binding":"i1"}`},
		{ImageBytes{Bytes: 5}, `{"bytes":5}`},
		{GPUFailed{GPU: 1, Error: "e"}, `{"gpu":1,"error":"e"}`},
		{Fault{GPU: 1, Function: "f.a", Error: "e"}, `{"gpu":1,"function":"f.a","error":"e"}`},
	} {
		b, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("%T:\n got %s\nwant %s", c.v, b, c.want)
		}
	}
	sd, _ := json.Marshal(SimDevice{Node: node, Kernels: "reference", ProcessWide: true})
	for _, f := range []string{`"node":`, `"kernels":"reference"`, `"process_wide":true`} {
		if !strings.Contains(string(sd), f) {
			t.Errorf("SimDevice %s lacks %s", sd, f)
		}
	}
}

// TestDecodeRefuses: malformed frames are refused with ErrProtocol, never misread.
func TestDecodeRefuses(t *testing.T) {
	good, _ := Encode(KindStatus, 0, 1, nil)
	bad := func(mut func(b []byte) []byte) []byte { return mut(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"short":         good[:10],
		"magic":         bad(func(b []byte) []byte { b[0] ^= 1; return b }),
		"major":         bad(func(b []byte) []byte { b[4] = 2; return b }),
		"length":        bad(func(b []byte) []byte { b[12] = 5; return b }),
		"trailing":      append(append([]byte(nil), good...), 'x'),
		"body too long": bad(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[12:], MaxBody+1); return b }),
	} {
		if _, err := Decode(b); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Encode(KindStatus, 0, 1, strings.Repeat("x", MaxBody)); !errors.Is(err, ErrProtocol) {
		t.Errorf("an oversized body was encoded: %v", err)
	}
}

// TestPeer: calls and replies across a real socketpair, with descriptors; sentinel errors travel by code; a
// handler that panics or a kind nobody handles is answered with an error, and the peer goes on; a malformed
// datagram is dropped; when one side closes, the other's calls fail with ErrClosed.
func TestPeer(t *testing.T) {
	mine, theirs, err := Socketpair()
	if err != nil {
		t.Fatal(err)
	}
	other, err := FileConn(theirs)
	theirs.Close()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server := NewPeer(other, map[Kind]Handler{
		KindBorrow: func(_ context.Context, f Frame) (any, []*os.File, error) {
			b, err := Body[Borrow](f)
			if err != nil {
				return nil, nil, err
			}
			r, w, err := os.Pipe()
			if err != nil {
				return nil, nil, err
			}
			_, _ = w.Write([]byte("chunk"))
			w.Close()
			return Lent{GPU: b.GPU, Indexes: []int{b.N}}, []*os.File{r}, nil
		},
		KindEvict: func(context.Context, Frame) (any, []*os.File, error) {
			return nil, nil, fmtBusy()
		},
		KindStatus: func(context.Context, Frame) (any, []*os.File, error) { panic("a bug") },
	}, Codes, nil)
	go func() { _ = server.Serve(ctx) }()
	client := NewPeer(mine, nil, Codes, nil)
	go func() { _ = client.Serve(ctx) }()

	var lent Lent
	files, err := client.Call(ctx, KindBorrow, Borrow{GPU: 1, N: 7}, nil, &lent)
	if err != nil || len(files) != 1 || lent.GPU != 1 || len(lent.Indexes) != 1 || lent.Indexes[0] != 7 {
		t.Fatalf("borrow: %+v %d files %v", lent, len(files), err)
	}
	got, _ := io.ReadAll(files[0])
	files[0].Close()
	if string(got) != "chunk" {
		t.Fatalf("the descriptor read %q", got)
	}
	_, err = client.Call(ctx, KindEvict, Evict{}, nil, nil)
	if !errors.Is(err, executor.ErrBusy) || !errors.Is(err, pool.ErrBindingBroken) || errors.Is(err, executor.ErrPinned) {
		t.Fatalf("evict: %v: want ErrBusy and ErrBindingBroken to travel", err)
	}
	if _, err := client.Call(ctx, KindStatus, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("a panicking handler: %v", err)
	}
	if _, err := client.Call(ctx, KindFault, nil, nil, nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a kind without a handler: %v", err)
	}
	if err := write(mine, []byte("not a frame at all, longer than a header"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Call(ctx, KindBorrow, Borrow{N: 1}, nil, &lent); err != nil {
		t.Fatalf("after a malformed frame: %v", err)
	}
	_ = server.Close()
	<-client.Done()
	if _, err := client.Call(ctx, KindBorrow, Borrow{}, nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call after the other side closed: %v", err)
	}
	var _ net.Conn = mine
}

func fmtBusy() error {
	return errors.Join(executor.ErrBusy, pool.ErrBindingBroken)
}

// TestEverySentinelTravels: every sentinel error of the packages whose errors cross the control socket has a code,
// so that errors.Is answers on the gpuserver as it did in the executor (a sentinel added later without a code
// would silently become a 500).
func TestEverySentinelTravels(t *testing.T) {
	known := map[error]bool{}
	for _, c := range Codes {
		known[c.Err] = true
	}
	byName := map[string]error{
		"executor.ErrUnknownFunction": executor.ErrUnknownFunction, "executor.ErrNotCaptured": executor.ErrNotCaptured,
		"executor.ErrBusy": executor.ErrBusy, "executor.ErrPinned": executor.ErrPinned,
		"executor.ErrUnhealthy": executor.ErrUnhealthy, "executor.ErrNoMemory": executor.ErrNoMemory,
		"executor.ErrInvalid": executor.ErrInvalid, "executor.ErrBroken": executor.ErrBroken,
		"executor.ErrLost": executor.ErrLost, "executor.ErrContextFault": executor.ErrContextFault,
		"executor.ErrHoldExpired": executor.ErrHoldExpired, "executor.ErrReadOnly": executor.ErrReadOnly,
		"pool.ErrUnknownFunction": pool.ErrUnknownFunction, "pool.ErrUnknownBinding": pool.ErrUnknownBinding,
		"pool.ErrInvalidSpec": pool.ErrInvalidSpec, "pool.ErrTooLarge": pool.ErrTooLarge,
		"pool.ErrGPUUnhealthy": pool.ErrGPUUnhealthy, "pool.ErrBindingBroken": pool.ErrBindingBroken,
		"pool.ErrFunctionLost": pool.ErrFunctionLost, "pool.ErrNoHealthyGPU": pool.ErrNoHealthyGPU,
		"pool.ErrLimit": pool.ErrLimit, "pool.ErrOverloaded": pool.ErrOverloaded, "pool.ErrBackedOff": pool.ErrBackedOff,
	}
	for name, err := range byName {
		if !known[err] {
			t.Errorf("%s has no code in Codes", name)
		}
	}
	// Sentinels declared in the packages' sources must all be listed above (so a new one fails here first).
	for pkg, dir := range map[string]string{"executor": "../../executor", "pool": "../../pool"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			src, err := os.ReadFile(dir + "/" + e.Name())
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(src), "\n") {
				f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "var "))
				if len(f) >= 3 && strings.HasPrefix(f[0], "Err") && f[1] == "=" && strings.HasPrefix(f[2], "errors.New") {
					if _, ok := byName[pkg+"."+f[0]]; !ok {
						t.Errorf("%s.%s (%s) is not known to this test: give it a code in Codes and list it", pkg, f[0],
							e.Name())
					}
				}
			}
		}
	}
}
