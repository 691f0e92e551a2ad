package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/openfaas/faas-provider/types"
)

// TestTenantsThroughUp: two teams on one machine through `faas-gpu up` (an executor process per tenant, the
// default), as a user would drive it: faas-cli's namespace create (the go-sdk's request), the same GPU function
// deployed to openfaas-fn and to team-b, each invoked as name.namespace. Team b's function then tries, from outside,
// what a hostile tenant would: kernels reading the other team's model and module global at their device addresses.
// Each attempt fails (never the other team's numbers), the victim keeps answering exactly, and the attacker, whose
// executor its own fault ended, answers again once restarted.
func TestTenantsThroughUp(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	work := t.TempDir()
	fns := filepath.Join(work, "functions", "tenant-fn")
	if err := os.MkdirAll(fns, 0o755); err != nil {
		t.Fatal(err)
	}
	root := repoRoot(t)
	for _, f := range []struct{ from, to string }{
		{filepath.Join(root, "test", "e2e", "testdata", "tenant-fn", "handler.py"), "handler.py"},
		{filepath.Join(root, "functions", "vector-add", "cudadrv.py"), "cudadrv.py"},
		{filepath.Join(root, "functions", "vector-add", "kernels.ptx"), "kernels.ptx"},
	} {
		raw, err := os.ReadFile(f.from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(fns, f.to), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(fns, "requirements.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(work, "state")
	in := startUpIn(t, t.TempDir(), stateDir, 0, "--state-dir", stateDir, "--build-dir", filepath.Join(work, "build"),
		"--templates-dir", filepath.Join(root, "template"), "--functions-dir", filepath.Join(work, "functions"),
		"--gpu-memory", "4Gi", "--shim-dir", shimDir(t), "--log-level", "debug")

	// faas-cli namespace create team-b (the go-sdk: POST /system/namespace/, no Content-Type).
	r := call(t, http.MethodPost, in.url+"/system/namespace/",
		`{"name":"team-b","labels":{"openfaas":"1"},"annotations":{"openfaas":"1"}}`,
		map[string]string{"Authorization": basicAuth(in.user, in.password)})
	if r.code != http.StatusCreated {
		t.Fatalf("namespace create: %d %s", r.code, r.body)
	}
	for _, ns := range []string{"openfaas-fn", "team-b"} {
		deploy(t, in, types.FunctionDeployment{Service: "tenant-fn", Image: "tenant-fn:latest", Namespace: ns,
			Annotations: &map[string]string{"com.openfaas.gpu.memory": "256Mi"}})
	}
	type answer struct {
		Sum    float64 `json:"sum"`
		Model  uint64  `json:"model"`
		Global uint64  `json:"global"`
	}
	const modelSum, globalSum = 1049600, 11287552 // 2*(1+...+1024), 2*(5000+...+6023)
	victimURL, attackerURL := in.url+"/function/tenant-fn.openfaas-fn", in.url+"/function/tenant-fn.team-b"
	var victim answer
	if err := json.Unmarshal([]byte(invokeReady(t, victimURL, "{}")), &victim); err != nil || victim.Sum != modelSum {
		t.Fatalf("the victim: %+v %v", victim, err)
	}
	if out := invokeReady(t, attackerURL, "{}"); out == "" {
		t.Fatal("the attacker does not answer")
	}
	for _, c := range []struct {
		what string
		addr uint64
	}{{"model", victim.Model}, {"module global", victim.Global}} {
		r := call(t, http.MethodPost, attackerURL, `{"read":`+strconv.FormatUint(c.addr, 10)+`}`, nil)
		var got answer
		_ = json.Unmarshal([]byte(r.body), &got)
		t.Logf("team b reading team a's %s at %#x: %d %s", c.what, c.addr, r.code, r.body)
		if r.code == http.StatusOK || got.Sum == modelSum || got.Sum == globalSum {
			t.Errorf("team b read team a's %s: %d %s", c.what, r.code, r.body)
		}
		var again answer
		if err := json.Unmarshal([]byte(invokeReady(t, victimURL, "{}")), &again); err != nil || again.Sum != modelSum {
			t.Errorf("the victim after the attack on its %s: %+v %v", c.what, again, err)
		}
		invokeReady(t, attackerURL, "{}") // the attacker's executor and process start again
	}
}
