package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"

	"sigs.k8s.io/yaml"
)

// codeSpan is a Markdown code span on one line.
var codeSpan = regexp.MustCompile("`([^`\n]+)`")

// goRefShape is a code span shaped like a Go reference: identifiers joined by dots (pkg.Func, Type.Method,
// pkg.Type.Method), with an optional () after it.
var goRefShape = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?$`)

// diagramRef is a Go-shaped reference inside a diagram's text (a Mermaid block has no code spans).
var diagramRef = regexp.MustCompile(`\b[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+\b`)

// fileSuffixes end a dotted name that is a file, not a Go reference (`api.go`, `index.py`, `gpuserver.sock`).
var fileSuffixes = map[string]bool{"go": true, "py": true, "c": true, "h": true, "md": true, "json": true,
	"yml": true, "yaml": true, "txt": true, "sh": true, "api": true, "so": true, "sock": true, "csv": true,
	"tsv": true, "npy": true, "whl": true, "png": true, "toml": true, "mod": true, "sum": true, "cfg": true,
	"js": true, "html": true, "ptx": true, "cubin": true, "cu": true, "log": true, "key": true, "pem": true,
	"tar": true, "gz": true, "ini": true, "service": true, "conf": true, "out": true, "bin": true, "pid": true}

// notGo are the first names of dotted references docs make to code that is not Go, and what they are.
var notGo = map[string]string{
	"torch": "PyTorch (Python)",
}

// foreign are references docs make to Go code of other projects, not dependencies of the module, and where it is.
var foreign = map[string]string{
	"metrics.mixIn":             "the OpenFaaS gateway's gateway/metrics (openfaas/faas 0.27.14)",
	"functions.imagePullPolicy": "a value of the stock OpenFaaS chart (openfaas/faas-netes), not of charts/faas-gpu",
}

// docRef is one Go-shaped reference of a document.
type docRef struct {
	doc, ref string
	line     int
}

// docsWithReferences are the documents whose code references are checked: the README, docs/*.md, the functions'
// and the chart's READMEs (the benchmarks' pages under docs/bench are written by their programs).
func docsWithReferences(t *testing.T) []string {
	t.Helper()
	docs := []string{"../../README.md", "../../charts/faas-gpu/README.md"}
	for _, glob := range []string{"../../docs/*.md", "../../functions/*/README.md"} {
		more, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, more...)
	}
	return docs
}

// goReferences lists the Go-shaped references of a document: its code spans outside code blocks, and the
// dotted names of its Mermaid diagrams.
func goReferences(doc, src string) []docRef {
	var out []docRef
	fence, mermaid := false, false
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			fence = !fence
			mermaid = fence && strings.TrimPrefix(trimmed, "```") == "mermaid"
			continue
		}
		switch {
		case fence && mermaid:
			for _, m := range diagramRef.FindAllString(line, -1) {
				out = append(out, docRef{doc: doc, ref: m, line: i + 1})
			}
		case !fence:
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				if g := goRefShape.FindStringSubmatch(strings.TrimSpace(m[1])); g != nil {
					out = append(out, docRef{doc: doc, ref: g[1], line: i + 1})
				}
			}
		}
	}
	return out
}

// TestDocsNameCodeThatExists: every `Type.Method`, `package.Func` and `package.Type.Member` the README, docs/*.md
// and the functions' and chart's READMEs name in a code span (or in a Mermaid diagram) exists: the type, function, variable, constant, field
// or method is declared in the repository's Go code (a method or field promoted from an embedded type counts), or,
// for a package outside it, in the standard library or the dependency named. A reference is checked when its
// first name is a package of the repository, a type of it, a package outside it that docs name, or when it is
// shaped like Go (`Type.Method`, `pkg.Exported`) without being any of those; a dotted name of another kind
// (a Helm value of charts/faas-gpu/values.yaml, an annotation, a file name, `name.namespace`) is not. So a doc
// cannot keep naming `trackedPool.Acquire` once it is renamed or moved.
func TestDocsNameCodeThatExists(t *testing.T) {
	ix := repoIndex(t)
	ext := newExternals(t)
	values := chartValues(t)
	checked := 0
	for _, doc := range docsWithReferences(t) {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(doc, "../../")
		for _, r := range goReferences(name, string(src)) {
			ok, check, why := resolveRef(t, ix, ext, values, r.ref)
			if !check {
				continue
			}
			checked++
			if os.Getenv("DOCS_REFS_VERBOSE") != "" {
				t.Logf("%s:%d `%s` ok=%v", r.doc, r.line, r.ref, ok)
			}
			if !ok {
				t.Errorf("%s:%d names `%s`, which is not in the code: %s", r.doc, r.line, r.ref, why)
			}
		}
	}
	if checked < 60 {
		t.Fatalf("checked only %d references to code: the extraction broke", checked)
	}
	t.Logf("%d references to code checked", checked)
}

// resolveRef says whether ref names code that exists (ok), whether it is a reference to check at all (check), and
// why not when it does not (why).
func resolveRef(t *testing.T, ix *goIndex, ext *externals, values map[string]any, ref string) (ok, check bool,
	why string) {
	t.Helper()
	parts := strings.Split(ref, ".")
	if fileSuffixes[strings.ToLower(parts[len(parts)-1])] {
		return false, false, ""
	}
	if _, ok := notGo[parts[0]]; ok {
		return false, false, ""
	}
	if _, ok := foreign[ref]; ok {
		return false, false, ""
	}
	first, second := parts[0], parts[1]
	if isChartValue(values, parts) {
		return false, false, ""
	}
	if pkgs := ix.byName[first]; len(pkgs) > 0 {
		if inPackages(ix, pkgs, parts[1:]) {
			return true, true, ""
		}
		if outside := ext.packages(t, first); len(outside) > 0 && inExternal(outside, parts[1:]) {
			return true, true, ""
		}
		return false, true, "no package " + first + " of the repository (" + dirsOf(pkgs) + ") declares " +
			strings.Join(parts[1:], ".")
	}
	if tys := ix.types[first]; len(tys) > 0 {
		for _, ty := range tys {
			if _, ok := ix.member(ty, second, map[*goType]bool{}); ok {
				return true, true, ""
			}
		}
		return false, true, "no type " + first + " of the repository has a field or method " + second
	}
	if outside := ext.packages(t, first); len(outside) > 0 {
		if inExternal(outside, parts[1:]) {
			return true, true, ""
		}
		return false, true, "package " + first + " (outside the repository) does not declare " +
			strings.Join(parts[1:], ".")
	}
	if camelCase(first) { // an unexported type's name shape (`trackedPool.hold`): a Go reference whatever follows
		return false, true, "no type or package " + first + " in the repository"
	}
	if !upper(second) {
		return false, false, "" // prose-like: `name.namespace`, `com.openfaas.scale.min`
	}
	if upper(first) {
		return false, true, "no type " + first + " in the repository"
	}
	return false, true, "no type or package " + first + " in the repository, the standard library or the " +
		"dependencies docs name (test/docs dependencyPackages)"
}

// camelCase says whether s is a lower-case identifier with an upper-case letter inside (trackedPool, deviceHandler),
// the shape of an unexported Go name; a Helm value of that shape (networkPolicy.enabled) is told apart earlier.
func camelCase(s string) bool {
	if upper(s) || strings.ContainsAny(s, "_") {
		return false
	}
	for _, r := range s[1:] {
		if unicode.IsUpper(r) {
			return true
		}
	}
	return false
}

// inPackages says whether one of pkgs declares rest[0] (and, when rest names a member, whether that type has it).
func inPackages(ix *goIndex, pkgs []*goPackage, rest []string) bool {
	for _, p := range pkgs {
		if _, ok := p.decls[rest[0]]; !ok {
			continue
		}
		if len(rest) == 1 {
			return true
		}
		ty := p.types[rest[0]]
		if ty == nil {
			return true // a variable or function: what follows is not checked
		}
		if _, ok := ix.member(ty, rest[1], map[*goType]bool{}); ok {
			return true
		}
	}
	return false
}

// inExternal is inPackages for packages outside the repository (each parsed alone: no promoted members).
func inExternal(pkgs []*goPackage, rest []string) bool {
	for _, p := range pkgs {
		if _, ok := p.decls[rest[0]]; !ok {
			continue
		}
		ty := p.types[rest[0]]
		if len(rest) == 1 || ty == nil {
			return true
		}
		if _, ok := ty.members[rest[1]]; ok {
			return true
		}
	}
	return false
}

func upper(s string) bool {
	for _, r := range s {
		return unicode.IsUpper(r)
	}
	return false
}

func dirsOf(pkgs []*goPackage) string {
	var dirs []string
	for _, p := range pkgs {
		dirs = append(dirs, p.dir)
	}
	sort.Strings(dirs)
	return strings.Join(dirs, ", ")
}

// chartValues are the chart's values (charts/faas-gpu/values.yaml): docs name them as dotted paths.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	src, err := os.ReadFile("../../charts/faas-gpu/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(src, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// isChartValue says whether parts is a path of the chart's values (a prefix of one counts: `gpuserver.ui`).
func isChartValue(values map[string]any, parts []string) bool {
	cur := any(values)
	for _, p := range parts {
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[p]; !ok {
			return false
		}
	}
	return true
}
