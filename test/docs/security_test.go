// Package docs checks that the documents cannot drift from the code: every test docs/security.md cites exists,
// every file and package docs/architecture.md names exists and every package is on its map,
// and docs/metrics.md lists exactly the metrics the code registers.
package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestSecurityDocCitesExistingTests: every `TestX`, `FuzzX` named in docs/security.md is a test function of the
// repository, so that the document's claims stay pinned by the tests it names.
func TestSecurityDocCitesExistingTests(t *testing.T) {
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	cited := map[string]bool{}
	for _, m := range regexp.MustCompile(`\b((?:Test|Fuzz)[A-Z][A-Za-z0-9_]*)`).FindAllStringSubmatch(string(doc), -1) {
		cited[m[1]] = true
	}
	if len(cited) == 0 {
		t.Fatal("docs/security.md cites no test")
	}
	defined := map[string]bool{}
	def := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]*)\(`)
	goSources(t, func(path string) bool { return strings.HasSuffix(path, "_test.go") }, func(_, src string) {
		for _, m := range def.FindAllStringSubmatch(src, -1) {
			defined[m[1]] = true
		}
	})
	for name := range cited {
		if !defined[name] {
			t.Errorf("docs/security.md cites %s, which no test defines", name)
		}
	}
}
