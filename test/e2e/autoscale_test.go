package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestAutoscalingThroughUp is the figure, through a real `faas-gpu up`: a CPU function whose handler holds
// each request 200 ms, deployed with com.openfaas.scale.min 1 and com.openfaas.scale.max 8, under a steady load of
// 20 concurrent clients reaches 8 replicas (all ready, every request answered 200), and once the load ends comes
// back to 1 replica, not before the scale-down window (3 s here, -scale-down-window; 40 s by default). The times
// are logged. The autoscaler's decisions are in up's log and /metrics.
func TestAutoscalingThroughUp(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	const window = 3 * time.Second
	work := t.TempDir()
	root := repoRoot(t)
	build := filepath.Join(work, "build")
	if err := shrinkwrap.Assemble(filepath.Join(root, "template", "gpu-python"),
		filepath.Join(root, "test", "e2e", "testdata", "sleepy"), filepath.Join(build, "sleepy")); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(work, "state")
	in := startUpIn(t, t.TempDir(), stateDir, 0, "--state-dir", stateDir, "--build-dir", build,
		"--templates-dir", filepath.Join(root, "template"), "--functions-dir", filepath.Join(work, "functions"),
		"--gpu-memory", "4Gi", "--shim-dir", shimDir(t), "--log-level", "debug",
		"--scale-down-window", window.String(), "--autoscale-interval", "250ms")
	deploy(t, in, types.FunctionDeployment{Service: "sleepy", Image: "sleepy:latest",
		Labels: &map[string]string{"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "8"}})
	url := in.url + "/function/sleepy"
	// One request in flight asks for 1 replica (a replica is full at target 1 x proportion 1.0, the defaults).
	invokeReady(t, url, "")

	// 20 clients, each sending its next request as soon as the last is answered.
	var stop atomic.Bool
	var answered, failed atomic.Int64
	var lastFailure atomic.Value
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 2 * time.Minute}
	start := time.Now()
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				resp, err := client.Post(url, "text/plain", nil)
				if err != nil {
					failed.Add(1)
					lastFailure.Store(err.Error())
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
					lastFailure.Store(fmt.Sprintf("%d %s", resp.StatusCode, body))
					continue
				}
				answered.Add(1)
			}
		}()
	}
	endLoad := func() time.Time {
		stop.Store(true)
		wg.Wait()
		return time.Now()
	}
	defer endLoad()
	var toEight time.Duration
	testkit.EventuallyNil(t, 2*time.Minute, "8 replicas under the load", func() error {
		st := functionStatus(t, in, "sleepy")
		if st.Replicas == 8 && toEight == 0 {
			toEight = time.Since(start)
		}
		if st.Replicas != 8 || st.AvailableReplicas != 8 {
			return fmt.Errorf("%d replicas, %d ready", st.Replicas, st.AvailableReplicas)
		}
		return nil
	})
	allReady := time.Since(start)
	// The load goes on with every replica serving.
	before := answered.Load()
	testkit.EventuallyNil(t, time.Minute, "40 more answers with 8 replicas", func() error {
		if n := answered.Load() - before; n < 40 {
			return fmt.Errorf("%d answers", n)
		}
		return nil
	})
	if st := functionStatus(t, in, "sleepy"); st.Replicas != 8 {
		t.Fatalf("%d replicas under a steady load of 20 clients, want 8", st.Replicas)
	}
	ended := endLoad()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed under the load (last: %v)", n, n+answered.Load(), lastFailure.Load())
	}
	var toOne time.Duration
	testkit.EventuallyNil(t, time.Minute, "back to 1 replica after the load", func() error {
		st := functionStatus(t, in, "sleepy")
		if st.Replicas != 1 {
			return fmt.Errorf("%d replicas", st.Replicas)
		}
		if toOne == 0 {
			toOne = time.Since(ended)
		}
		if st.AvailableReplicas != 1 {
			return fmt.Errorf("%d ready", st.AvailableReplicas)
		}
		return nil
	})
	// Not before the window: the last look that saw a request in flight came after the proxy ended the last
	// request, which may precede the client's reading its answer by a moment (slack).
	const slack = 200 * time.Millisecond
	if toOne < window-slack {
		t.Fatalf("scaled down %s after the load ended, within the %s window", toOne, window)
	}
	t.Logf("min 1, max 8, 20 clients x 200 ms requests: 8 replicas wanted %s after the load started, all 8 ready "+
		"after %s; %d requests answered, none failed; back to 1 replica %s after the load ended (window %s)",
		toEight.Round(10*time.Millisecond), allReady.Round(10*time.Millisecond), answered.Load(),
		toOne.Round(10*time.Millisecond), window)

	decided := false
	for _, line := range strings.Split(in.out.String(), "\n") {
		decided = decided || strings.Contains(line, `msg="function autoscaled"`) &&
			strings.Contains(line, "function=sleepy") && strings.Contains(line, " to=8 ")
	}
	if !decided {
		t.Fatalf("up's log has no decision to 8 replicas:\n%s", in.out.String())
	}
	metrics := call(t, http.MethodGet, in.url+"/metrics", nil, nil).body
	for _, want := range []string{
		`faas_gpu_autoscaler_decisions_total{direction="up",function="sleepy.openfaas-fn"}`,
		`faas_gpu_autoscaler_decisions_total{direction="down",function="sleepy.openfaas-fn"}`,
		`faas_gpu_autoscaler_replicas{function="sleepy.openfaas-fn"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}
