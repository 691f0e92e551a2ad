package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestMakeRunBuildsTheExampleFunctions: as the README says, `make run` lays out ./build/<fn>/ for the functions of
// stack.yml (from ./template, where faas-cli reads templates) before it starts faas-gpu up.
func TestMakeRunBuildsTheExampleFunctions(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cmd := exec.Command("make", "-n", "run")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, out)
	}
	text := string(out)
	shrinkwrap := strings.Index(text, "shrinkwrap -f stack.yml -templates template -out build")
	up := strings.Index(text, "bin/faas-gpu up")
	if shrinkwrap < 0 || up < 0 || shrinkwrap > up {
		t.Fatalf("make run does not build the functions (from ./template) before faas-gpu up:\n%s", text)
	}
}
