package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestCommentsCiteTheRepository: comments and messages name the property they keep, not the issue that asked for
// it (an issue number means nothing to a reader of the code), and cite the design record in the repository
// (docs/design.md, whose numbered decisions they name must exist), not a brief outside it.
func TestCommentsCiteTheRepository(t *testing.T) {
	design, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	decisions := map[int]bool{}
	for _, m := range regexp.MustCompile(`(?m)^(\d+)\. \*\*`).FindAllStringSubmatch(string(design), -1) {
		n, _ := strconv.Atoi(m[1])
		decisions[n] = true
	}
	if len(decisions) < 9 {
		t.Fatalf("docs/design.md has %d numbered decisions", len(decisions))
	}
	issue := regexp.MustCompile(`(?i)\bissues? #?[0-9]+\b|\(#[0-9]+\)`)
	brief := regexp.MustCompile(`\bDESIGN\.md`)
	cited := regexp.MustCompile(`docs/design\.md,? decisions? ([0-9]+)`)
	checked := 0
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "../.." || d.Name() == "node_modules" ||
			d.Name() == "build" || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		switch filepath.Ext(path) {
		case ".go", ".c", ".h", ".py", ".sh", ".api", ".tpl", ".yaml":
		default:
			if d.Name() != "Makefile" {
				return nil
			}
		}
		if d.IsDir() || strings.HasSuffix(path, "_gen.go") || strings.HasSuffix(path, "_gen.c") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		rel := strings.TrimPrefix(path, "../../")
		for i, line := range strings.Split(string(src), "\n") {
			if m := issue.FindString(line); m != "" && rel != "test/docs/comments_test.go" {
				t.Errorf("%s:%d cites %q: name the property instead", rel, i+1, m)
			}
			if brief.MatchString(line) && rel != "test/docs/comments_test.go" {
				t.Errorf("%s:%d cites DESIGN.md, a brief outside the repository: cite docs/design.md", rel, i+1)
			}
			for _, m := range cited.FindAllStringSubmatch(line, -1) {
				if n, _ := strconv.Atoi(m[1]); !decisions[n] {
					t.Errorf("%s:%d cites decision %d, which docs/design.md does not have", rel, i+1, n)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 300 {
		t.Fatalf("checked only %d files", checked)
	}
}
