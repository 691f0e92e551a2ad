package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// markdownDocs returns the repository's Markdown files (the README, docs/, the functions' and charts' READMEs).
func markdownDocs(t *testing.T) []string {
	t.Helper()
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
	return docs
}

var (
	fence      = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	// flagDef is a flag's registration in cmd/faas-gpu: fs.StringVar(&c.x, "name", ...), fs.Var(&v, "name", ...).
	flagDef = regexp.MustCompile(`\.(?:String|Bool|Int|Int64|Uint|Uint64|Float64|Duration|Func|BoolFunc|Text)?(?:Var)?\((?:&?[A-Za-z0-9_.]+, )?"([a-z][a-z0-9-]*)",`)
	// faasGPUCommand is a command line of faas-gpu (bin/faas-gpu up ..., faas-gpu provider ...) or of make run's
	// arguments for it (RUN_ARGS=...); the rest of the line holds its flags.
	faasGPUCommand = regexp.MustCompile(`(?:(?:^|[\s/(])faas-gpu (?:up|provider|gpuserver|queue-worker|sim|replay|pool|usage)\b|RUN_ARGS=)(.*)`)
	docFlag        = regexp.MustCompile(`(?:^|[\s"'=])--?([a-z][a-z0-9-]*)`)
	makeCommand    = regexp.MustCompile(`(?:^|[\s(;&|])make((?: +[^\s|;&#)]+)+)`)
	makeTarget     = regexp.MustCompile(`(?m)^([a-zA-Z0-9_.-]+):`)
)

// docCode returns the code of a Markdown text: each fenced block's lines (continuation lines joined) and each
// inline code span.
func docCode(src string) []string {
	var out []string
	for _, m := range fence.FindAllStringSubmatch(src, -1) {
		out = append(out, strings.Split(strings.ReplaceAll(m[1], "\\\n", " "), "\n")...)
	}
	for _, m := range inlineCode.FindAllStringSubmatch(fence.ReplaceAllString(src, ""), -1) {
		out = append(out, m[1])
	}
	return out
}

// faasGPUFlags is every flag some subcommand of cmd/faas-gpu registers.
func faasGPUFlags(t *testing.T) map[string]bool {
	t.Helper()
	flags := map[string]bool{"h": true, "help": true}
	goSources(t, func(path string) bool {
		return strings.HasPrefix(filepath.ToSlash(path), "../../cmd/faas-gpu/") && !strings.HasSuffix(path, "_test.go")
	}, func(_, src string) {
		for _, m := range flagDef.FindAllStringSubmatch(src, -1) {
			flags[m[1]] = true
		}
	})
	if len(flags) < 60 {
		t.Fatalf("found only %d flags in cmd/faas-gpu: the pattern no longer matches their registrations", len(flags))
	}
	return flags
}

// TestDocumentedFaasGPUFlagsExist: every flag a doc passes to a faas-gpu command (faas-gpu up, provider, gpuserver,
// ..., and make run's RUN_ARGS) is a flag of faas-gpu, so that a renamed or removed flag cannot linger in a doc.
func TestDocumentedFaasGPUFlagsExist(t *testing.T) {
	flags := faasGPUFlags(t)
	checked := 0
	for _, doc := range markdownDocs(t) {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range docCode(string(src)) {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue // a shell comment
			}
			m := faasGPUCommand.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			rest := m[1]
			for _, stop := range []string{" | ", " # ", "; ", " && ", " > ", " 2>"} {
				if i := strings.Index(rest, stop); i >= 0 {
					rest = rest[:i]
				}
			}
			for _, f := range docFlag.FindAllStringSubmatch(rest, -1) {
				checked++
				if !flags[f[1]] {
					t.Errorf("%s: %q passes -%s, which no faas-gpu command has", doc, strings.TrimSpace(line), f[1])
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d documented faas-gpu flags: the patterns no longer find the docs' commands", checked)
	}
}

// TestDocumentedMakeTargetsExist: every `make <target>` in a doc names a target of the Makefile (make -C shim ...
// the shim's Makefile).
func TestDocumentedMakeTargetsExist(t *testing.T) {
	targets := func(path string) map[string]bool {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, m := range makeTarget.FindAllStringSubmatch(string(raw), -1) {
			out[m[1]] = true
		}
		return out
	}
	root, shim := targets("../../Makefile"), targets("../../shim/Makefile")
	var named []string
	for _, doc := range markdownDocs(t) {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range docCode(string(src)) {
			for _, m := range makeCommand.FindAllStringSubmatch(line, -1) {
				have := root
				args := strings.Fields(m[1])
				for i := 0; i < len(args); i++ {
					a := strings.Trim(args[i], "`\"'")
					switch {
					case a == "-C" && i+1 < len(args):
						if strings.TrimSuffix(args[i+1], "/") == "shim" {
							have = shim
						}
						i++
					case strings.HasPrefix(a, "-") || strings.Contains(a, "=") || a == "":
					case !regexp.MustCompile(`^[a-z][a-z0-9-]*$`).MatchString(a):
						i = len(args) // prose or a path: the command ended
					default:
						named = append(named, a)
						if !have[a] {
							t.Errorf("%s: %q names make target %q, which the Makefile lacks", doc, strings.TrimSpace(line), a)
						}
					}
				}
			}
		}
	}
	sort.Strings(named)
	if len(named) < 20 {
		t.Fatalf("found only %d make targets in the docs: %v", len(named), named)
	}
}

// TestCheckDocsRunsExistingTests: the tests `make check-docs` runs (DOC_TESTS, DOC_NETWORK_TESTS) are tests of
// test/e2e, so that renaming one cannot make the target run nothing.
func TestCheckDocsRunsExistingTests(t *testing.T) {
	raw, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^DOC(?:_NETWORK)?_TESTS := (.+)$`).FindAllStringSubmatch(string(raw), -1) {
		names = append(names, strings.Split(m[1], "|")...)
	}
	if len(names) < 5 {
		t.Fatalf("the Makefile's DOC_TESTS and DOC_NETWORK_TESTS name %d tests", len(names))
	}
	var e2e strings.Builder
	goSources(t, func(path string) bool { return strings.HasPrefix(filepath.ToSlash(path), "../../test/e2e/") },
		func(_, src string) { e2e.WriteString(src) })
	for _, n := range names {
		if !strings.Contains(e2e.String(), "func "+n+"(t *testing.T)") {
			t.Errorf("make check-docs runs %s, which test/e2e does not have", n)
		}
	}
}
