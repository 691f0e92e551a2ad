package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/test/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"
)

// callbacks collects the callbacks of asynchronous calls by X-Call-Id.
type callbacks struct {
	srv *httptest.Server
	mu  sync.Mutex
	got map[string]reply
}

func newCallbacks(t *testing.T) *callbacks {
	c := &callbacks{got: map[string]reply{}}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.got[r.Header.Get("X-Call-Id")] = reply{header: r.Header.Clone(), body: string(raw)}
		c.mu.Unlock()
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *callbacks) wait(t *testing.T, id string) reply {
	t.Helper()
	var r reply
	testkit.EventuallyNil(t, 60*time.Second, "callback for "+id, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		var ok bool
		if r, ok = c.got[id]; !ok {
			return errors.New("none yet")
		}
		return nil
	})
	return r
}

// postRaw sends a request whose path is written as given (no client-side cleaning or re-encoding).
func postRaw(t *testing.T, base, rawPath string, body []byte, header map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = "//" + req.URL.Host + rawPath
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", rawPath, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return reply{code: resp.StatusCode, header: resp.Header, body: string(raw)}
}

// The asynchronous path of `faas-gpu up` as users and attackers reach it: faas-cli's `invoke --async` request, paths
// and callbacks that would reach the provider's API, a message published straight to NATS, the reserved queue name,
// NATS credentials and the body limit.
func TestAsyncEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	work := t.TempDir()
	stateDir := filepath.Join(work, "state")
	in := startUp(t, stateDir)
	base := in.url
	deploy(t, in, types.FunctionDeployment{Service: "echo", Image: "echo:latest"})
	invokeReady(t, base+"/function/echo", "warm up")
	cbs := newCallbacks(t)
	listed := func() []string {
		r := in.system(t, http.MethodGet, "/system/functions", nil)
		var fns []types.FunctionStatus
		if err := json.Unmarshal([]byte(r.body), &fns); err != nil {
			t.Fatalf("list: %d %s", r.code, r.body)
		}
		var names []string
		for _, f := range fns {
			names = append(names, f.Name)
		}
		return names
	}

	t.Run("faas-cli invoke --async", func(t *testing.T) {
		// faas-cli 0.18 posts to /async-function/<name>.<namespace>.
		r := postRaw(t, base, "/async-function/echo.openfaas-fn", []byte("hello async"),
			map[string]string{"X-Callback-Url": cbs.srv.URL + "/done", "Content-Type": "text/plain"})
		if r.code != http.StatusAccepted {
			t.Fatalf("POST /async-function/echo.openfaas-fn: %d %s, want 202", r.code, r.body)
		}
		c := cbs.wait(t, r.header.Get("X-Call-Id"))
		if c.body != "hello async" || c.header.Get("X-Function-Status") != "200" || c.header.Get("X-Function-Name") != "echo.openfaas-fn" {
			t.Fatalf("callback %v %q", c.header, c.body)
		}
		if r := postRaw(t, base, "/async-function/echo.prod", []byte("x"), nil); r.code != http.StatusNotFound ||
			!strings.Contains(r.body, "echo.prod") {
			t.Fatalf("unknown namespace: %d %s, want 404 naming echo.prod", r.code, r.body)
		}
	})

	t.Run("paths and callbacks cannot reach the provider API", func(t *testing.T) {
		evil, _ := json.Marshal(types.FunctionDeployment{Service: "evil", Image: "echo:latest", EnvProcess: "touch /tmp/pwned"})
		for _, p := range []string{"/async-function/echo/%252e%252e/%252e%252e/system/functions",
			"/async-function/echo/%25252e%25252e/%25252e%25252e/system/functions", "/async-function/echo/..%255c..%255csystem%255cfunctions"} {
			if r := postRaw(t, base, p, evil, map[string]string{"Content-Type": "application/json"}); r.code != http.StatusBadRequest {
				t.Errorf("POST %s: %d %s, want 400", p, r.code, r.body)
			}
		}
		u, _ := url.Parse(base)
		for _, cb := range []string{base + "/system/functions", "http://localhost:" + u.Port() + "/system/functions"} {
			if r := postRaw(t, base, "/async-function/echo", evil, map[string]string{"X-Callback-Url": cb,
				"Content-Type": "application/json"}); r.code != http.StatusBadRequest || !strings.Contains(r.body, "gateway") {
				t.Errorf("callback %s: %d %s, want 400", cb, r.code, r.body)
			}
		}
		// A message published straight to NATS (with the credentials) naming the gateway as callback: the
		// worker refuses to call back there and dead-letters the call.
		_, js := connectNATS(t, stateDir)
		gw, _ := url.Parse(base + "/system/functions")
		msg, _ := json.Marshal(types.QueueRequest{Function: "echo", Method: http.MethodPost, Body: evil, CallbackURL: gw,
			Header: http.Header{"X-Call-Id": {"straight-to-nats"}, "Content-Type": {"application/json"}}})
		if _, err := js.Publish(context.Background(), "faas-request", msg); err != nil {
			t.Fatal(err)
		}
		testkit.EventuallyNil(t, 60*time.Second, "dead letter of straight-to-nats", func() error {
			reason, err := deadLetterReason(js, "straight-to-nats")
			if err != nil {
				return err
			}
			if !strings.HasPrefix(reason, "callback_refused") {
				t.Fatalf("dead letter reason %q, want callback_refused", reason)
			}
			return nil
		})
		for _, name := range listed() {
			if name == "evil" {
				t.Fatal("a function was deployed through the asynchronous path")
			}
		}
	})

	t.Run("reserved queue refused at deploy", func(t *testing.T) {
		fd := types.FunctionDeployment{Service: "echo2", Image: "echo:latest",
			Annotations: &map[string]string{"com.openfaas.queue": "faas-dead-letter"}}
		r := in.system(t, http.MethodPost, "/system/functions", fd)
		if r.code != http.StatusBadRequest || !strings.Contains(r.body, "com.openfaas.queue") {
			t.Fatalf("deploy with the dead letters' queue: %d %s, want 400 naming the annotation", r.code, r.body)
		}
	})

	t.Run("NATS requires the credentials up created", func(t *testing.T) {
		for path, want := range map[string]os.FileMode{
			filepath.Join(stateDir, "secrets"):                  0o700,
			filepath.Join(stateDir, "secrets", "nats-password"): 0o600,
			filepath.Join(stateDir, "nats-url"):                 0o600,
		} {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
			}
		}
		raw, err := os.ReadFile(filepath.Join(stateDir, "nats-url"))
		if err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(strings.TrimSpace(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		u.User = nil
		if nc, err := nats.Connect(u.String(), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatal("connected to the embedded NATS without credentials")
		}
	})

	t.Run("one 4 MiB body limit end to end", func(t *testing.T) {
		body := bytes.Repeat([]byte("0123456789abcdef"), (4<<20)/16)
		r := postRaw(t, base, "/async-function/echo", body, map[string]string{"X-Callback-Url": cbs.srv.URL,
			"Content-Type": "application/octet-stream", "X-Call-Id": "four-mib"})
		if r.code != http.StatusAccepted {
			t.Fatalf("a 4 MiB body: %d %s, want 202", r.code, r.body)
		}
		if c := cbs.wait(t, "four-mib"); c.header.Get("X-Function-Status") != "200" || c.body != string(body) {
			t.Fatalf("4 MiB call's callback: status %s, %d bytes", c.header.Get("X-Function-Status"), len(c.body))
		}
		r = postRaw(t, base, "/async-function/echo", append(body, 'x'), nil)
		if r.code != http.StatusRequestEntityTooLarge || !strings.Contains(r.body, "4194304 bytes") {
			t.Fatalf("4 MiB + 1 byte: %d %s, want 413 naming the limit", r.code, r.body)
		}
	})
}

// connectNATS connects to the embedded NATS of `up` with the URL (credentials included) it wrote to its state dir.
func connectNATS(t *testing.T, stateDir string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(stateDir, "nats-url"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("connecting with the credentials up wrote: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// deadLetterReason returns the reason of the dead letter of a call, or an error while there is none.
func deadLetterReason(js jetstream.JetStream, callID string) (string, error) {
	ctx := context.Background()
	st, err := js.Stream(ctx, "OF_faas-dead-letter")
	if err != nil {
		return "", err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return "", err
	}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		if m.Header.Get("X-Call-Id") == callID {
			return m.Header.Get("Faas-Dead-Letter-Reason"), nil
		}
	}
	return "", fmt.Errorf("no dead letter for %s among %d", callID, info.State.Msgs)
}
