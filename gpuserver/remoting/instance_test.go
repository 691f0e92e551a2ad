package remoting

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// instanceRegistry is registry knowing instances: it records what it was told.
type instanceRegistry struct {
	registry
	mu    sync.Mutex
	known []string
	ended []string
}

func (r *instanceRegistry) Instance(_ context.Context, function, instance string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := pool.InstanceKey(function, instance)
	r.known = append(r.known, key)
	return key, nil
}

func (r *instanceRegistry) InstanceEnded(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = append(r.ended, key)
}

// helloInstance says hello as instance of fn (the instance block after the hello) and returns the reply's
// status and message.
func helloInstance(t *testing.T, sock, fn, token, instance string) (*net.UnixConn, int32, string) {
	t.Helper()
	fd, mem := newSharedMemory(t)
	defer unix.Close(fd)
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b := helloBytes(fn, token, uint64(len(mem)))
	binary.LittleEndian.PutUint32(b[wireHelloFlags:], wireHelloFlagInstance)
	block := make([]byte, wireHelloInstanceSize)
	copy(block[:wireHelloInstanceSize-1], instance)
	if _, _, err := c.WriteMsgUnix(append(b, block...), unix.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	reply := make([]byte, wireReplySize)
	if _, err := io.ReadFull(c, reply); err != nil {
		t.Fatalf("hello reply: %v", err)
	}
	return c, int32(binary.LittleEndian.Uint32(reply[wireReplyStatus:])), cstring(reply[wireReplyMessage:])
}

// TestHelloNamesItsInstance: the hello named only a function, so every process of a function ran in one address
// space, one GPU at a time. A hello with the instance block (protocol 1.3) runs its session under the instance's
// key, which the registry made known, and hears when its last session ended; an instance name outside the allowed
// bytes is refused as an identity, naming the instance.
func TestHelloNamesItsInstance(t *testing.T) {
	reg := &instanceRegistry{registry: registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 64 << 20}, "tok"}}}
	var (
		mu    sync.Mutex
		infos []string
	)
	r := startServerWith(t, nil, func(cfg *Config) {
		cfg.Functions = reg
		cfg.NewHandler = func(_ context.Context, info SessionInfo) (Handler, error) {
			mu.Lock()
			infos = append(infos, info.Function)
			mu.Unlock()
			return UnimplementedHandler{}, nil
		}
	})
	c, st, msg := helloInstance(t, r.sock, "f", "tok", "f-7")
	if st != wireStatusOK {
		t.Fatalf("hello as instance f-7: status %d %s", st, msg)
	}
	testkit.EventuallyNil(t, 10*time.Second, "the session runs as f@f-7", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(infos) != 1 || infos[0] != "f@f-7" {
			return fmt.Errorf("sessions %v", infos)
		}
		return nil
	})
	c.Close()
	testkit.EventuallyNil(t, 10*time.Second, "the registry hears the instance ended", func() error {
		reg.mu.Lock()
		defer reg.mu.Unlock()
		if len(reg.ended) != 1 || reg.ended[0] != "f@f-7" {
			return fmt.Errorf("known %v, ended %v", reg.known, reg.ended)
		}
		return nil
	})
	if _, st, msg := helloInstance(t, r.sock, "f", "tok", "bad/name"); st != wireStatusIdentity ||
		!strings.Contains(msg, "instance") {
		t.Errorf("hello as instance bad/name: status %d %q, want an identity refusal naming the instance", st, msg)
	}
}
