package local

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/test/testkit"
	"github.com/openfaas/faas-provider/types"
)

// TestFailedUpdateIsVisible: an update whose replicas exit before they are ready leaves the previous definition
// serving, and the function's status (Status and List) says that the update is not ready, why (the exit and the
// process's last line) and which image serves; the backend's log says it. A later update with working code rolls
// forward: its replica serves, the status says nothing more, the previous replica stops.
func TestFailedUpdateIsVisible(t *testing.T) {
	e := newEnv(t)
	buildContext(t, e.build, "broken", filepath.Join("testdata", "broken"))
	var logBuf testkit.Buffer
	e.cfg.Logger = slog.New(slog.NewTextHandler(&logBuf, nil))
	b := e.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fd := probe("probe")
	fd.Image = "probe:1"
	if err := b.Deploy(ctx, fd); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)
	servingPID := invokeProbe(t, b, "probe", "/", "").PID

	bad := fd
	bad.Image = "broken:2" // the build context testdata/broken: raises at import
	if err := b.Update(ctx, bad); err != nil {
		t.Fatal(err)
	}
	status := func() string {
		st, err := b.Status(ctx, "", "probe")
		if err != nil {
			t.Fatal(err)
		}
		if st.Annotations == nil {
			return ""
		}
		return (*st.Annotations)[StatusAnnotation]
	}
	testkit.Eventually(t, 60*time.Second, "the status to say the update is not ready", func() bool {
		return strings.HasPrefix(status(), "update not ready")
	})
	text := status()
	for _, want := range []string{"image broken:2", "exited before it was ready: exit status 1",
		"broken: this handler fails at import on purpose", "previous definition (image probe:1) keeps serving"} {
		if !strings.Contains(text, want) {
			t.Errorf("status %q lacks %q", text, want)
		}
	}
	list, err := b.List(ctx, "")
	if err != nil || len(list) != 1 || list[0].Annotations == nil ||
		!strings.HasPrefix((*list[0].Annotations)[StatusAnnotation], "update not ready") || list[0].Image != "broken:2" {
		t.Fatalf("List during the failed update: %+v %v", list, err)
	}
	// The previous definition serves: the same process answers, every time.
	for range 3 {
		code, out, err := routeInvoke(ctx, b, "probe", "/")
		var r probeReply
		if err != nil || code != http.StatusOK || json.Unmarshal(out, &r) != nil || r.PID != servingPID {
			t.Fatalf("during the failed update: %d %s %v, want the previous replica (pid %d)", code, out, err, servingPID)
		}
	}
	if st, _ := b.Status(ctx, "", "probe"); st.AvailableReplicas != 1 {
		t.Fatalf("available replicas during the failed update: %d, want 1 (the previous definition's)", st.AvailableReplicas)
	}
	if !strings.Contains(logBuf.String(), "function update is not ready; the previous definition keeps serving") {
		t.Errorf("the backend's log does not say the update failed:\n%s", logBuf.String())
	}

	fixed := fd
	fixed.Image = "probe:3"
	fixed.EnvVars = map[string]string{"FROM_FUNCTION": "fixed"}
	if err := b.Update(ctx, fixed); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "the fixed definition to serve", func() bool {
		code, out, err := routeInvoke(ctx, b, "probe", "/")
		var r probeReply
		return err == nil && code == http.StatusOK && json.Unmarshal(out, &r) == nil && r.Env["FROM_FUNCTION"] == "fixed"
	})
	testkit.Eventually(t, 60*time.Second, "the previous replica to stop", func() bool { return !alive(servingPID) })
	if s := status(); s != "" {
		t.Fatalf("status after rolling forward: %q, want nothing", s)
	}
}

// TestReplicasThatNeverStartShowInTheStatus: without an update, replicas still starting say so in the status, and
// replicas that keep exiting before they are ready are there with how the last one ended.
func TestReplicasThatNeverStartShowInTheStatus(t *testing.T) {
	e := newEnv(t)
	buildContext(t, e.build, "broken", filepath.Join("testdata", "broken"))
	b := e.open(t)
	if err := b.Deploy(context.Background(), types.FunctionDeployment{Service: "broken", Image: "broken:latest"}); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Status(context.Background(), "", "broken"); err != nil || st.Annotations == nil ||
		!strings.HasPrefix((*st.Annotations)[StatusAnnotation], "starting: 1 replica(s), none ready yet") {
		t.Fatalf("status right after the deploy: %+v %v, want it starting", st, err)
	}
	testkit.Eventually(t, 60*time.Second, "the status to say the replicas do not start", func() bool {
		st, err := b.Status(context.Background(), "", "broken")
		return err == nil && st.Annotations != nil && strings.HasPrefix((*st.Annotations)[StatusAnnotation],
			"not ready: its replicas exit before they are ready") &&
			strings.Contains((*st.Annotations)[StatusAnnotation], "fails at import on purpose")
	})
}
