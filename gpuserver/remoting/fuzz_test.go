package remoting

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// FuzzDecodeRecord feeds arbitrary records to the decoder and dispatch: it must never panic, and a record it
// accepts must have the size its header announces. The seed corpus is the C shim's golden records plus
// testdata/fuzz/FuzzDecodeRecord.
func FuzzDecodeRecord(f *testing.F) {
	_, recs := goldenRecords(f)
	for _, r := range recs {
		f.Add(r)
	}
	resp := make([]byte, 1<<16)
	f.Fuzz(func(t *testing.T, rec []byte) {
		h := &recorder{}
		_, _, n, err := DecodeRecord(context.Background(), h, rec, resp)
		if err == nil && (len(rec) < wireRecordHeaderSize || n > len(resp)) {
			t.Fatalf("accepted a %d-byte record, wrote %d response bytes", len(rec), n)
		}
	})
}

// FuzzHello feeds arbitrary first messages (with or without a memfd) to a session's handshake: the server must
// never panic, must answer a hello it reads with a well-formed reply or close, and must accept only the one
// identity it knows. The seed corpus is a valid hello plus testdata/fuzz/FuzzHello.
func FuzzHello(f *testing.F) {
	f.Add(helloBytes("f", "tok", wireControlSize+testRingSize+testRespSize), true)
	f.Add(helloBytes("f", "wrong", wireControlSize+testRingSize+testRespSize), true)
	f.Add(helloBytes("f", "tok", 1<<63), true)
	f.Add(helloBytes("", "", 0), false)
	f.Add([]byte("FGRM"), false)
	funcs := registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}}
	srv, err := NewServer(Config{Functions: funcs, Logger: slog.New(slog.DiscardHandler),
		HelloTimeout: 2 * time.Second,
		NewHandler:   func(context.Context, SessionInfo) (Handler, error) { return UnimplementedHandler{}, nil }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, msg []byte, withMemfd bool) {
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		server, client := fileConn(t, fds[0]), fileConn(t, fds[1])
		defer client.Close()
		var oob []byte
		if withMemfd {
			fd, mem := newSharedMemory(t)
			defer syscall.Close(fd)
			defer syscall.Munmap(mem)
			oob = syscall.UnixRights(fd)
		}
		if len(msg) > 0 || oob != nil {
			if _, _, err := client.WriteMsgUnix(msg, oob, nil); err != nil {
				t.Fatal(err)
			}
		}
		_ = client.CloseWrite()
		srv.mu.Lock()
		srv.pending++
		srv.pendingBy["fuzz"]++
		srv.mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.serveConnContained(context.Background(), server, "fuzz")
			server.Close()
		}()
		_ = client.SetReadDeadline(time.Now().Add(30 * time.Second))
		reply, _ := io.ReadAll(client)
		<-done
		if srv.Stats().SessionPanics != 0 {
			t.Fatalf("the handshake panicked on %q", msg)
		}
		if len(reply) == 0 {
			return
		}
		if len(reply) != wireReplySize || binary.LittleEndian.Uint32(reply) != wireMagic {
			t.Fatalf("malformed reply of %d bytes", len(reply))
		}
		ok := int32(binary.LittleEndian.Uint32(reply[wireReplyStatus:])) == wireStatusOK
		if ok && (len(msg) < wireHelloSize || cstring(msg[wireHelloFunction:wireHelloFunction+wireNameMax]) != "f" ||
			cstring(msg[wireHelloToken:wireHelloToken+wireNameMax]) != "tok" || !withMemfd) {
			t.Fatalf("accepted a hello that proves no identity: %q", msg)
		}
	})
}

func fileConn(t *testing.T, fd int) *net.UnixConn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socketpair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn)
}
