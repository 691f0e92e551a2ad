package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// gpuFunctionState is the gpuserver's view of one function: requests bound now and released so far.
func gpuFunctionState(t *testing.T, gs *client.Client, name string) (running int, served int64) {
	t.Helper()
	st, err := gs.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range st.Functions {
		if f.Name == name {
			return f.Running, f.Served
		}
	}
	t.Fatalf("the gpuserver does not know %s: %+v", name, st.Functions)
	return 0, 0
}

// TestSharedBindingThroughUp deploys a GPU function whose handler opts in to several requests in flight
// (testdata/batchy: CONCURRENCY = 32, the gpu-python template's FAAS_GPU_CONCURRENCY, which the llm function's
// continuous batching sets) through `faas-gpu up` on the simulated node: 16 concurrent streaming requests are in its
// handler at once (a barrier of 16 passes), all under the same binding, the gpuserver sees one request bound while
// they stream and one served when they end. The same function with FAAS_GPU_CONCURRENCY=1 (the template's default)
// still takes a binding of its own per request.
func TestSharedBindingThroughUp(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	root := repoRoot(t)
	fns := filepath.Join(t.TempDir(), "functions")
	for _, name := range []string{"batchy", "batchy-one"} {
		if err := os.MkdirAll(filepath.Join(fns, name), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"handler.py", "requirements.txt"} {
			b, err := os.ReadFile(filepath.Join(root, "test", "e2e", "testdata", "batchy", f))
			if err == nil {
				err = os.WriteFile(filepath.Join(fns, name, f), b, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	in := startUp(t, stateDir, "--functions-dir", fns)
	annotations := map[string]string{"com.openfaas.gpu.memory": "256Mi"}
	deploy(t, in, types.FunctionDeployment{Service: "batchy", Image: "batchy:latest", Annotations: &annotations})
	deploy(t, in, types.FunctionDeployment{Service: "batchy-one", Image: "batchy-one:latest",
		Annotations: &annotations, EnvVars: map[string]string{"FAAS_GPU_CONCURRENCY": "1"}})
	gs := upGPUServer(t, stateDir)

	// streams sends n concurrent requests ?n=together and answers each one's first line and whether it ended.
	type line struct {
		Binding  string
		Together bool
		Done     bool
	}
	streams := func(fn string, n, together int, held func()) ([]line, []error) {
		first := make([]line, n)
		errs := make([]error, n)
		var got, wg sync.WaitGroup
		got.Add(n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				gotOne := false
				defer func() {
					if !gotOne {
						got.Done()
					}
				}()
				resp, err := http.Post(fmt.Sprintf("%s/function/%s?n=%d", in.url, fn, together), "text/plain", nil)
				if err != nil {
					errs[i] = err
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs[i] = fmt.Errorf("status %d", resp.StatusCode)
					return
				}
				sc := bufio.NewScanner(resp.Body)
				var last line
				for k := 0; sc.Scan(); k++ {
					var l line
					if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
						errs[i] = fmt.Errorf("line %q: %w", sc.Text(), err)
						return
					}
					if k == 0 {
						first[i] = l
						gotOne = true
						got.Done()
					}
					last = l
				}
				if err := sc.Err(); err != nil || !last.Done {
					errs[i] = fmt.Errorf("the stream ended before its last line (%v)", err)
				}
			}()
		}
		got.Wait()
		if held != nil {
			held()
		}
		wg.Wait()
		return first, errs
	}
	release := func(fn string) {
		t.Helper()
		if r := call(t, http.MethodPost, in.url+"/function/"+fn+"?release=1", "", nil); r.code != http.StatusOK {
			t.Errorf("release: %d %s", r.code, r.body)
		}
	}

	invokeReady(t, in.url+"/function/batchy?ready=1", "")
	_, before := gpuFunctionState(t, gs, "batchy")
	var running int
	first, errs := streams("batchy", 16, 16, func() {
		running, _ = gpuFunctionState(t, gs, "batchy") // all 16 have sent their first line and wait
		release("batchy")
	})
	bindings := map[string]int{}
	for i, l := range first {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
		}
		if !l.Together {
			t.Errorf("request %d: the 16 requests were never in the handler at once: %+v", i, l)
		}
		bindings[l.Binding]++
	}
	if len(bindings) != 1 || bindings[""] != 0 {
		t.Errorf("bindings of the 16 requests: %v, want one", bindings)
	}
	if running != 1 {
		t.Errorf("the gpuserver saw %d requests of batchy bound while 16 streamed, want 1 (their shared binding)", running)
	}
	// The 16 and the release request (which joined their binding): one binding, released once.
	testkit.EventuallyNil(t, 30*time.Second, "batchy's binding released once", func() error {
		if r, s := gpuFunctionState(t, gs, "batchy"); r != 0 || s != before+1 {
			return fmt.Errorf("running %d, served %d, want 0 and %d", r, s, before+1)
		}
		return nil
	})

	// The template's default: each request its own binding, one at a time (released at once: ?release=1 first).
	invokeReady(t, in.url+"/function/batchy-one?release=1", "")
	_, before = gpuFunctionState(t, gs, "batchy-one")
	first, errs = streams("batchy-one", 3, 1, nil)
	bindings = map[string]int{}
	for i, l := range first {
		if errs[i] != nil {
			t.Errorf("batchy-one request %d: %v", i, errs[i])
		}
		bindings[l.Binding]++
	}
	if len(bindings) != 3 {
		t.Errorf("bindings of 3 requests with FAAS_GPU_CONCURRENCY=1: %v, want 3 of their own", bindings)
	}
	if _, s := gpuFunctionState(t, gs, "batchy-one"); s != before+3 {
		t.Errorf("batchy-one served %d, want %d", s, before+3)
	}
}
