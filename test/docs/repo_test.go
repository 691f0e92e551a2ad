package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goSources calls visit with every Go file of the repository whose name keep accepts, and its contents; hidden
// folders, node_modules, build outputs and test data are skipped.
func goSources(t *testing.T, keep func(path string) bool, visit func(path, src string)) {
	t.Helper()
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "../.." || d.Name() == "node_modules" ||
			d.Name() == "build" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || !keep(path) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		visit(path, string(src))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
