package handlers

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/local"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// httpSecret stands for the basic-auth password: what a hostile build context links to.
const httpSecret = "faas-gpu-handlers-build-secret-1a7e"

// The third round's build attacks over the provider's HTTP surface: a build context with a link to the password
// is refused with 400 naming the entry; requirements with --find-links <state dir> with 400 naming the option; a
// requirements.txt swapped for a link to the password after the deploy makes an unauthenticated
// POST /function/<name> answer 503 naming the function and its logs. The secret is in no response: not the
// deploy's, the invocation's, the function's status nor its logs.
func TestHostileBuildContextsOverHTTP(t *testing.T) {
	f := newFixture(t)
	state := t.TempDir()
	password := filepath.Join(state, "basic-auth-password")
	if err := os.WriteFile(password, []byte(httpSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(repo, "provider", "local", "testdata", "probe")
	tpl := filepath.Join(repo, "template", "gpu-python")
	context := func(name string, plant func(dir string) error) {
		t.Helper()
		dir := filepath.Join(f.build, name)
		if err := shrinkwrap.Assemble(tpl, probe, dir); err != nil {
			t.Fatal(err)
		}
		if plant != nil {
			if err := plant(filepath.Join(dir, "function")); err != nil {
				t.Fatal(err)
			}
		}
	}
	var bodies []string
	check := func(what string, code, want int, body, mention string) {
		t.Helper()
		bodies = append(bodies, body)
		if code != want || !strings.Contains(body, mention) {
			t.Errorf("%s: %d %q, want %d naming %q", what, code, body, want, mention)
		}
	}

	context("hostile-link", func(d string) error { return os.Symlink(password, filepath.Join(d, "key")) })
	code, _, body := f.do(t, http.MethodPost, "/system/functions", deployment("hostile-link"))
	check("deploying a context with a link to the password", code, http.StatusBadRequest, body, "function/key")

	context("hostile-find-links", func(d string) error {
		return os.WriteFile(filepath.Join(d, "requirements.txt"), []byte("--find-links "+state+"\nsix\n"), 0o644)
	})
	code, _, body = f.do(t, http.MethodPost, "/system/functions", deployment("hostile-find-links"))
	check("deploying --find-links <state dir>", code, http.StatusBadRequest, body, "--find-links")

	context("late-link", nil)
	fd := deployment("late-link")
	fd.Labels = &map[string]string{local.LabelScaleMin: "0"}
	f.deploy(t, fd)
	req := filepath.Join(f.build, "late-link", "function", "requirements.txt")
	if err := os.Remove(req); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink(password, req); err != nil {
		t.Fatal(err)
	}
	code, _, body = f.do(t, http.MethodPost, "/function/late-link", "x") // no credentials
	check("invoking it once its requirements.txt links to the password", code, http.StatusServiceUnavailable, body,
		`function "late-link": its build context was refused; see the function's logs`)
	code, _, body = f.do(t, http.MethodGet, "/system/function/late-link", nil)
	check("its status", code, http.StatusOK, body, "failed: ")
	testkit.Eventually(t, 30*time.Second, "the refusal in the function's logs", func() bool {
		_, _, logs := f.do(t, http.MethodGet, "/system/logs?name=late-link&follow=false", nil)
		return strings.Contains(logs, "function/requirements.txt: a symbolic link")
	})
	_, _, body = f.do(t, http.MethodGet, "/system/logs?name=late-link&follow=false", nil)
	bodies = append(bodies, body)
	_, _, body = f.do(t, http.MethodGet, "/system/functions", nil)
	bodies = append(bodies, body)
	for _, b := range bodies {
		if strings.Contains(b, httpSecret) {
			t.Errorf("a response carries the password: %s", b)
		}
	}
}
