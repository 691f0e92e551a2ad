package local

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReadableCopyOfAPrivateContext: a build context laid out as faas-cli new and build --shrinkwrap leave it
// (folders of mode 0700) is one others cannot read; its copy is, with the same files.
func TestReadableCopyOfAPrivateContext(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my-fn")
	if err := os.MkdirAll(filepath.Join(dir, "function"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for path, mode := range map[string]os.FileMode{"index.py": 0o644, "function/handler.py": 0o600, "run.sh": 0o700} {
		if err := os.WriteFile(filepath.Join(dir, path), []byte(path), mode); err != nil {
			t.Fatal(err)
		}
	}
	if othersCanRead(dir) {
		t.Fatal("a 0700 context counts as readable")
	}
	copyDir := filepath.Join(t.TempDir(), "copy")
	if err := readableCopy(dir, copyDir); err != nil {
		t.Fatal(err)
	}
	if !othersCanRead(copyDir) {
		t.Fatal("the copy is not readable by others")
	}
	for path, want := range map[string]os.FileMode{"function/handler.py": 0o644, "run.sh": 0o755, "function": 0o755} {
		st, err := os.Stat(filepath.Join(copyDir, path))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %o", path, st.Mode(), err, want)
		}
	}
	if raw, err := os.ReadFile(filepath.Join(copyDir, "function", "handler.py")); err != nil || string(raw) != "function/handler.py" {
		t.Fatalf("copied handler: %q %v", raw, err)
	}
	if !othersCanRead(filepath.Join("testdata", "probe")) {
		t.Fatal("the repository's test contexts count as private")
	}
}
