package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// module is the repository's module path (go.mod).
const module = "github.com/faas-gpu/faas-gpu"

// goPackage is what the doc tests know of one package, read with go/parser (no type checking: go/packages is not a
// dependency of the module).
type goPackage struct {
	dir   string // relative to its root, slash-separated ("gpuserver/executor"; for the standard library "net/http")
	name  string
	decls map[string]string  // top-level identifier -> the file declaring it
	types map[string]*goType // its named types
	// imports are the module's packages its non-test files import (dirs relative to the repository).
	imports map[string]bool
}

// goType is a named type: its fields and methods (members) and the types it embeds, whose members it has too.
type goType struct {
	pkg     *goPackage
	name    string
	members map[string]string // field or method -> the file declaring it
	embeds  []typeRef
}

// typeRef names a type: its package's directory and its name.
type typeRef struct{ dir, name string }

// goIndex is every package of a tree (the repository's non-test files, or a module's).
type goIndex struct {
	root   string
	pkgs   map[string]*goPackage   // by dir
	byName map[string][]*goPackage // by package name
	types  map[string][]*goType    // by type name, over every package
}

var (
	repoIndexOnce sync.Once
	repoIndexVal  *goIndex
	repoIndexErr  error
)

// repoIndex parses every non-test Go file of the repository once.
func repoIndex(t *testing.T) *goIndex {
	t.Helper()
	repoIndexOnce.Do(func() { repoIndexVal, repoIndexErr = parseTree("../..", module) })
	if repoIndexErr != nil {
		t.Fatal(repoIndexErr)
	}
	return repoIndexVal
}

// parseTree parses the non-test Go files under root, a tree of packages whose import paths start with prefix.
func parseTree(root, prefix string) (*goIndex, error) {
	ix := &goIndex{root: root, pkgs: map[string]*goPackage{}, byName: map[string][]*goPackage{},
		types: map[string][]*goType{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" ||
			d.Name() == "build" || d.Name() == "testdata" || d.Name() == "bin" || d.Name() == "vendor") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		ix.add(rel, f, prefix)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ix, nil
}

// add indexes one file (its path relative to the tree's root).
func (ix *goIndex) add(file string, f *ast.File, prefix string) {
	dir := pathDir(file)
	p := ix.pkgs[dir]
	if p == nil {
		p = &goPackage{dir: dir, name: f.Name.Name, decls: map[string]string{}, types: map[string]*goType{},
			imports: map[string]bool{}}
		ix.pkgs[dir] = p
		ix.byName[p.name] = append(ix.byName[p.name], p)
	}
	imports := map[string]string{} // local name -> dir of a package of the tree
	for _, im := range f.Imports {
		path, _ := strconv.Unquote(im.Path.Value)
		local := path[strings.LastIndex(path, "/")+1:]
		if im.Name != nil {
			local = im.Name.Name
		}
		if rel, ok := strings.CutPrefix(path, prefix+"/"); ok {
			p.imports[rel] = true
			imports[local] = rel
		} else {
			imports[local] = "\x00" + path // outside the tree
		}
	}
	typeOf := func(name string) *goType {
		ty := p.types[name]
		if ty == nil {
			ty = &goType{pkg: p, name: name, members: map[string]string{}}
			p.types[name] = ty
			ix.types[name] = append(ix.types[name], ty)
		}
		return ty
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				p.decls[d.Name.Name] = file
				continue
			}
			if recv := baseTypeName(d.Recv.List[0].Type); recv != "" {
				typeOf(recv).members[d.Name.Name] = file
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.decls[n.Name] = file
					}
				case *ast.TypeSpec:
					p.decls[s.Name.Name] = file
					ty := typeOf(s.Name.Name)
					ty.addMembers(s.Type, file, dir, imports)
				}
			}
		}
	}
}

// addMembers records a type's fields, interface methods and embedded types.
func (ty *goType) addMembers(expr ast.Expr, file, dir string, imports map[string]string) {
	var fields []*ast.Field
	switch tt := expr.(type) {
	case *ast.StructType:
		fields = tt.Fields.List
	case *ast.InterfaceType:
		fields = tt.Methods.List
	default:
		return
	}
	for _, fl := range fields {
		for _, n := range fl.Names {
			ty.members[n.Name] = file
		}
		if len(fl.Names) > 0 {
			continue
		}
		// An embedded type: its name is a member too, and its members are promoted.
		ref, ok := embedded(fl.Type, dir, imports)
		if !ok {
			continue
		}
		ty.members[ref.name] = file
		ty.embeds = append(ty.embeds, ref)
	}
}

// embedded names an embedded field's type.
func embedded(e ast.Expr, dir string, imports map[string]string) (typeRef, bool) {
	switch x := e.(type) {
	case *ast.StarExpr:
		return embedded(x.X, dir, imports)
	case *ast.IndexExpr:
		return embedded(x.X, dir, imports)
	case *ast.IndexListExpr:
		return embedded(x.X, dir, imports)
	case *ast.Ident:
		return typeRef{dir: dir, name: x.Name}, true
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok {
			if d, ok := imports[id.Name]; ok {
				return typeRef{dir: d, name: x.Sel.Name}, true
			}
		}
	}
	return typeRef{}, false
}

// baseTypeName is a receiver's type name (T of T, *T, T[K], *T[K]).
func baseTypeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return baseTypeName(x.X)
	case *ast.IndexExpr:
		return baseTypeName(x.X)
	case *ast.IndexListExpr:
		return baseTypeName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// member says whether ty has a field or method name, directly or promoted from a type it embeds (in this index;
// an embedded type of another tree, such as sync.Mutex, is not followed), and the file declaring it.
func (ix *goIndex) member(ty *goType, name string, seen map[*goType]bool) (string, bool) {
	if seen[ty] {
		return "", false
	}
	seen[ty] = true
	if file, ok := ty.members[name]; ok {
		return file, true
	}
	for _, e := range ty.embeds {
		if p := ix.pkgs[e.dir]; p != nil {
			if et := p.types[e.name]; et != nil {
				if file, ok := ix.member(et, name, seen); ok {
					return file, true
				}
			}
		}
	}
	return "", false
}

// pathDir is a slash path's directory ("" for a file at the root).
func pathDir(file string) string {
	if i := strings.LastIndex(file, "/"); i >= 0 {
		return file[:i]
	}
	return ""
}

// externals are the packages outside the repository a doc may name by package name, parsed from the Go root and
// the module cache on first use: the standard library by the last element of its import path, and the
// dependencies listed here.
type externals struct {
	mu     sync.Mutex
	goroot string
	std    map[string][]string // package name -> import paths in the standard library
	mods   map[string]string   // module path -> its version (go.mod)
	cache  string              // the module cache
	parsed map[string]*goIndex // import path -> its package alone
}

// dependencyPackages are the packages of the module's dependencies that docs name, by the name docs use; one
// whose module go.mod no longer requires is not looked up.
var dependencyPackages = map[string][]string{
	"types":      {"github.com/openfaas/faas-provider/types"},
	"auth":       {"github.com/openfaas/faas-provider/auth"},
	"prometheus": {"github.com/prometheus/client_golang/prometheus"},
	"promhttp":   {"github.com/prometheus/client_golang/prometheus/promhttp"},
	"jetstream":  {"github.com/nats-io/nats.go/jetstream"},
	"nats":       {"github.com/nats-io/nats.go"},
	"chi":        {"github.com/go-chi/chi/v5"},
	"mux":        {"github.com/gorilla/mux"},
}

func newExternals(t *testing.T) *externals {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("go env GOROOT GOMODCACHE answered %q", out)
	}
	x := &externals{goroot: lines[0], cache: lines[1], std: map[string][]string{}, mods: map[string]string{},
		parsed: map[string]*goIndex{}}
	src := filepath.Join(x.goroot, "src")
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if n := d.Name(); path != src && (n == "testdata" || n == "internal" || n == "vendor" || n == "cmd" ||
			strings.HasPrefix(n, ".")) {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(src, path)
		if rel != "." {
			x.std[filepath.Base(rel)] = append(x.std[filepath.Base(rel)], filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.Open("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	defer gomod.Close()
	sc := bufio.NewScanner(gomod)
	for sc.Scan() {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(f) >= 2 && strings.Contains(f[0], ".") && strings.HasPrefix(f[1], "v") {
			x.mods[f[0]] = f[1]
		}
	}
	return x
}

// packages returns the external packages a doc may mean by name (nil when none is known).
func (x *externals) packages(t *testing.T, name string) []*goPackage {
	t.Helper()
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []*goPackage
	for _, path := range append(append([]string(nil), x.std[name]...), dependencyPackages[name]...) {
		ix, ok := x.parsed[path]
		if !ok {
			ix = x.parse(t, path)
			x.parsed[path] = ix
		}
		if ix == nil {
			continue
		}
		for _, p := range ix.pkgs {
			if p.dir == "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// parse reads one external package's non-test files (nil when it has none).
func (x *externals) parse(t *testing.T, path string) *goIndex {
	t.Helper()
	dir := filepath.Join(x.goroot, "src", filepath.FromSlash(path))
	if !strings.Contains(strings.SplitN(path, "/", 2)[0], ".") {
		return parseDir(t, dir)
	}
	for mod, version := range x.mods {
		if path == mod || strings.HasPrefix(path, mod+"/") {
			sub := strings.TrimPrefix(strings.TrimPrefix(path, mod), "/")
			return parseDir(t, filepath.Join(x.cache, escapeModule(mod)+"@"+version, filepath.FromSlash(sub)))
		}
	}
	return nil // not a dependency (any more): a doc naming it fails as naming an unknown package
}

// parseDir parses the non-test Go files of one directory (not its subdirectories) as the package at "".
func parseDir(t *testing.T, dir string) *goIndex {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v (is the module downloaded? go mod download)", dir, err)
	}
	ix := &goIndex{root: dir, pkgs: map[string]*goPackage{}, byName: map[string][]*goPackage{},
		types: map[string][]*goType{}}
	fset := token.NewFileSet()
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name == "main" || strings.HasSuffix(f.Name.Name, "_test") {
			continue
		}
		ix.add(n, f, "\x00")
	}
	if len(ix.pkgs) == 0 {
		return nil
	}
	return ix
}

// escapeModule is a module path as the module cache spells it (an upper-case letter as ! and its lower case).
func escapeModule(mod string) string {
	var b strings.Builder
	for _, r := range mod {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
