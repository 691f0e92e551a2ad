package local

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReplicasAssembleFoldersOfTheirOwn: replicas of a function assembled from a template and a handler folder
// shared one folder, and each replica's start cleared and copied it again, so that one replica starting (or
// restarting, or rolling) removed the files another was running from (seen as a replica answering with the wrong
// code, and as "directory not empty" while eight replicas of one function started at once). Each replica now
// assembles a folder of its own, and assembling one leaves another's untouched.
func TestReplicasAssembleFoldersOfTheirOwn(t *testing.T) {
	dir := t.TempDir()
	tpl, handlers := filepath.Join(dir, "template"), filepath.Join(dir, "functions")
	for path, text := range map[string]string{
		filepath.Join(tpl, "python", "index.py"):   "print('template')\n",
		filepath.Join(handlers, "f", "handler.py"): "def handle(req): return req\n",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := &Backend{cfg: Config{StateDir: filepath.Join(dir, "state"), BuildDir: filepath.Join(dir, "build"),
		TemplatesDir: tpl, Template: "python", FunctionsDir: handlers}}
	fn := recordView{name: "f", key: "f", image: "f:latest"}

	one, err := b.source(fn, "f-1")
	if err != nil {
		t.Fatal(err)
	}
	running := filepath.Join(one, "function", "handler.py")
	before, err := os.Stat(running)
	if err != nil {
		t.Fatalf("replica f-1's handler: %v", err)
	}
	two, err := b.source(fn, "f-2")
	if err != nil {
		t.Fatal(err)
	}
	if one == two {
		t.Fatalf("replicas f-1 and f-2 both run from %s", one)
	}
	after, err := os.Stat(running)
	if err != nil {
		t.Fatalf("assembling f-2 removed the handler f-1 runs from: %v", err)
	}
	if !os.SameFile(before, after) {
		t.Errorf("assembling f-2 replaced the handler f-1 runs from (%s)", running)
	}
	if got, err := b.source(fn, ""); err != nil || got != b.assembledApp(fn) {
		t.Errorf("a deploy's check: source = %q, %v; want %q (nothing assembled)", got, err, b.assembledApp(fn))
	}
}
