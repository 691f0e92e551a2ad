package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// chromium finds headless Chromium for the browser tier (`make test-ui`, FAAS_GPU_TEST_UI=1, which .ci/run runs
// after installing Debian's chromium): $FAAS_GPU_CHROMIUM, else chromium, chromium-browser or google-chrome on PATH.
// Outside the tier the test skips; in it, a missing Chromium fails it.
func chromium(t *testing.T) string {
	t.Helper()
	if os.Getenv("FAAS_GPU_TEST_UI") != "1" {
		t.Skip("loads the pool page in headless Chromium: runs in `make test-ui` (FAAS_GPU_TEST_UI=1; Debian: " +
			"apt-get install -y chromium)")
	}
	if p := os.Getenv("FAAS_GPU_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("needs headless Chromium: Debian's chromium package (apt-get install -y chromium), or FAAS_GPU_CHROMIUM")
	return ""
}

// busyNode writes a node file of four of h100x8's GPUs (memory is cut to 2 GiB each by -gpu-memory) and returns
// its path: the busy scene's node, short of memory.
func busyNode(t *testing.T) string {
	t.Helper()
	node, err := topology.Preset("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	node.Name = "h100x4"
	node.GPUs = node.GPUs[:n]
	node.NVLinkBytesPerSec = node.NVLinkBytesPerSec[:n]
	for i := range node.NVLinkBytesPerSec {
		node.NVLinkBytesPerSec[i] = node.NVLinkBytesPerSec[i][:n]
	}
	raw, err := json.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "h100x4.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runChromium runs headless Chromium on a page with a fresh profile, letting the page's scripts run for a few
// seconds of virtual time (its polls included), and returns its standard output.
func runChromium(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000", "--hide-scrollbars"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// TestPoolPageInChromium loads up's pool page (/ui) in headless Chromium behind the /system credentials, after GPU
// functions ran, and checks what it shows against the pool: every GPU's resident functions, every function's
// served requests. It saves a screenshot ($FAAS_GPU_UI_SCREENSHOT, else a temporary file). With
// FAAS_GPU_UI_SCENE=busy (`make ui-screenshot`, which writes docs/pool-page.png) the node is short of memory (4 GPUs
// of 2 GiB, 8 functions of 1 GiB besides) so that functions swap and are evicted, and the screenshot is taken under
// load.
func TestPoolPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up, python functions and Chromium")
	}
	bin := chromium(t)
	busy := os.Getenv("FAAS_GPU_UI_SCENE") == "busy"
	stateDir := filepath.Join(t.TempDir(), "state")
	var in *instance
	if busy {
		in = startUp(t, stateDir, "--gpus", busyNode(t), "--gpu-memory", "2Gi")
	} else {
		in = startUp(t, stateDir)
	}
	x := strings.Repeat("0.5, ", 1023) + "0.25"
	var extra []string // the busy scene's copies of mlp
	if busy {
		// Their image mlp:latest is the build context build/mlp, as `make functions` lays it out.
		root := repoRoot(t)
		if err := shrinkwrap.Assemble(filepath.Join(root, "template", "gpu-python"), filepath.Join(root, "functions", "mlp"),
			filepath.Join(stateDir, "..", "build", "mlp")); err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 8; i++ { // one at a time: python starts slowly on a loaded machine
			name := fmt.Sprintf("mlp-%d", i)
			extra = append(extra, name)
			deploy(t, in, types.FunctionDeployment{Service: name, Image: "mlp:latest", Annotations: &map[string]string{
				"com.openfaas.gpu.memory": "1Gi", "com.openfaas.gpu.slo": "250ms"}})
			invokeReady(t, in.url+"/function/"+name, `{"x": [`+x+`]}`)
		}
	}
	for _, fn := range []types.FunctionDeployment{
		{Service: "hello-gpu", Image: "hello-gpu:latest", Annotations: &map[string]string{
			"com.openfaas.gpu.memory": "1536Mi", "com.openfaas.gpu.slo": "80ms"}},
		{Service: "vector-add", Image: "vector-add:latest", Annotations: &map[string]string{
			"com.openfaas.gpu.memory": "64Mi", "com.openfaas.gpu.slo": "200ms"}},
		{Service: "mlp", Image: "mlp:latest", Annotations: &map[string]string{
			"com.openfaas.gpu.memory": "512Mi", "com.openfaas.gpu.slo": "500ms"}},
	} {
		deploy(t, in, fn)
	}
	invokeReady(t, in.url+"/function/hello-gpu", "{}")
	invokeReady(t, in.url+"/function/vector-add", `{"a": [1, 2, 3], "b": [10, 20, 30]}`)
	invokeReady(t, in.url+"/function/mlp", `{"x": [`+x+`]}`)
	for range 3 {
		call(t, http.MethodPost, in.url+"/function/vector-add", `{"a": [1], "b": [2]}`, nil)
		call(t, http.MethodPost, in.url+"/function/hello-gpu", "{}", nil)
	}
	if r := call(t, http.MethodGet, in.url+"/ui", nil, nil); r.code != http.StatusUnauthorized {
		t.Fatalf("/ui without credentials: %d, want 401", r.code)
	}

	u, err := url.Parse(in.url + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(in.user, in.password)
	dom := runChromium(t, bin, "--window-size=1400,1000", "--dump-dom", u.String())
	st, err := upGPUServer(t, stateDir).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dom, "live, updated") || strings.Contains(dom, "not updating") {
		t.Fatalf("the page did not load its state:\n%s", dom)
	}

	// What the page shows on each GPU is what the pool has resident there.
	shown := map[int][]string{}
	for _, m := range regexp.MustCompile(`<span class="chip[^"]*"[^>]*data-gpu="(\d+)"[^>]*>([^<]+)</span>`).
		FindAllStringSubmatch(dom, -1) {
		g, _ := strconv.Atoi(m[1])
		shown[g] = append(shown[g], m[2])
	}
	resident := 0
	for _, g := range st.GPUs {
		want := append([]string{}, g.Resident...)
		sort.Strings(want)
		got := shown[g.Index]
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("GPU %d: the page shows %v resident, the pool %v", g.Index, got, want)
		}
		resident += len(want)
	}
	if resident == 0 {
		t.Fatalf("no function is resident anywhere: the check shows nothing (%+v)", st.GPUs)
	}
	if n := strings.Count(dom, `class="gpu `); n != len(st.GPUs) {
		t.Errorf("the page shows %d GPUs, the pool has %d", n, len(st.GPUs))
	}
	// Each function's row: its served requests as the pool counts them, and its bill.
	rows := map[string]string{}
	for _, m := range regexp.MustCompile(`<tr data-function="([^"]+)" data-served="(\d+)"`).FindAllStringSubmatch(dom, -1) {
		rows[m[1]] = m[2]
	}
	for _, f := range st.Functions {
		if rows[f.Name] != strconv.FormatInt(f.Served, 10) || f.Served == 0 {
			t.Errorf("function %s: the page shows %q served, the pool %d", f.Name, rows[f.Name], f.Served)
		}
	}
	if len(rows) != len(st.Functions) || !strings.Contains(dom, "swapped in to GPU") ||
		!strings.Contains(dom, "is counted since") || !strings.Contains(dom, "faas-request") {
		t.Errorf("the page lacks functions, swaps, the bill or the queue:\n%s", dom)
	}

	shot := os.Getenv("FAAS_GPU_UI_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "pool-page.png")
	} else if shot, err = filepath.Abs(shot); err != nil {
		t.Fatal(err)
	}
	height := 1000
	if busy { // under load: requests run while the page is taken
		height = 1200
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for w := range 4 {
			go func() {
				for i := w; ctx.Err() == nil; i++ {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, in.url+"/function/"+extra[i%len(extra)],
						strings.NewReader(`{"x": [`+x+`]}`))
					if resp, err := http.DefaultClient.Do(req); err == nil {
						resp.Body.Close()
					}
				}
			}()
		}
		time.Sleep(5 * time.Second)
	}
	runChromium(t, bin, fmt.Sprintf("--window-size=1400,%d", height), "--screenshot="+shot, u.String())
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil || img.Bounds().Dx() != 1400 || img.Bounds().Dy() != height {
		t.Fatalf("screenshot %s: %v %v", shot, err, img)
	}
	t.Logf("screenshot of the pool page: %s", shot)
}
