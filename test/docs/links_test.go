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

// mdLink matches a Markdown link's target: [text](target), the target without spaces.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinksResolve: every relative link of the README, docs/, the functions' and the charts' READMEs names a
// file or folder of the repository, and a link to a heading of a Markdown file names a heading it has, so that
// moving a section (the README's details into docs/) cannot leave a reader at a dead link.
func TestDocLinksResolve(t *testing.T) {
	var docs []string
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "../.." || d.Name() == "node_modules" ||
			d.Name() == "build" || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			docs = append(docs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	links := 0
	for _, doc := range docs {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(string(src)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			file, anchor, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(filepath.Dir(doc), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", doc, target)
				continue
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			heads, err := headings(path)
			if err != nil {
				t.Fatal(err)
			}
			if !heads[anchor] {
				t.Errorf("%s links to %s, whose file has no heading #%s", doc, target, anchor)
			}
		}
	}
	if links < 60 {
		t.Fatalf("found only %d relative links in %d Markdown files", links, len(docs))
	}
}

// withoutCode is a Markdown text with its fenced code blocks blanked (a link there is code, not a link).
func withoutCode(src string) string {
	lines := strings.Split(src, "\n")
	code := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			code = !code
			lines[i] = ""
		} else if code {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// headings are the anchors GitHub gives a Markdown file's headings: lower case, punctuation other than - and _
// dropped, spaces as -, a repeated anchor suffixed -1, -2, ...
func headings(path string) (map[string]bool, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range strings.Split(withoutCode(string(src)), "\n") {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out, nil
}
