package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// route is an HTTP route: its method ("" for any) and its path pattern with every parameter written {}.
type route struct{ method, path string }

// routeParam is a path parameter as routers and docs write it: {name}, {name:regex}, {path...}, <name>, :name.
var routeParam = regexp.MustCompile(`\{[^}/]*\}|<[^>/]*>|:[A-Za-z_][A-Za-z0-9_]*`)

// normalRoute writes every parameter of a path as {} and drops a trailing slash.
func normalRoute(p string) string {
	p = routeParam.ReplaceAllString(p, "{}")
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return p
}

// httpMethods are the methods routers register by name (chi's r.Get, ...) and docs write before a path.
var httpMethods = map[string]string{"Get": "GET", "Head": "HEAD", "Post": "POST", "Put": "PUT", "Patch": "PATCH",
	"Delete": "DELETE", "Options": "OPTIONS", "Connect": "CONNECT", "Trace": "TRACE"}

// registeredRoutes are the routes the Go code under dirs registers, read from its syntax: chi's r.Get("/p", h)
// (and Post, Put, ..., Method("GET", "/p", h), Handle, HandleFunc), net/http's mux.HandleFunc("POST /p", h),
// gorilla's r.HandleFunc("/p", h).Methods(http.MethodGet), and the prefixes of chi's r.Route("/v1", func(r
// chi.Router) {...}) around them. A path built of a literal and a variable ("/function/"+name) has the variable
// as a parameter.
func registeredRoutes(t *testing.T, dirs ...string) map[route]string {
	t.Helper()
	out := map[route]string{}
	fset := token.NewFileSet()
	for _, dir := range dirs {
		root := filepath.Join("../..", dir)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			rel := filepath.ToSlash(strings.TrimPrefix(path, "../../"))
			collectRoutes(f, "", func(r route) { out[r] = rel })
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// collectRoutes finds the route registrations under n, each path under prefix.
func collectRoutes(n ast.Node, prefix string, add func(route)) {
	ast.Inspect(n, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		name := sel.Sel.Name
		switch {
		case name == "Methods" && len(call.Args) > 0: // gorilla: r.HandleFunc(path, h).Methods(...)
			inner, ok := sel.X.(*ast.CallExpr)
			if !ok {
				return true
			}
			isel, ok := inner.Fun.(*ast.SelectorExpr)
			if !ok || (isel.Sel.Name != "HandleFunc" && isel.Sel.Name != "Handle") || len(inner.Args) == 0 {
				return true
			}
			p, ok := stringValue(inner.Args[0])
			if !ok {
				return true
			}
			for _, a := range call.Args {
				if m, ok := methodValue(a); ok {
					add(route{m, normalRoute(prefix + p)})
				}
			}
			for _, a := range inner.Args[1:] { // the handler may register routes of its own
				collectRoutes(a, prefix, add)
			}
			return false
		case name == "Route" && len(call.Args) == 2: // chi: r.Route("/v1", func(r chi.Router) { ... })
			p, ok := stringValue(call.Args[0])
			if !ok {
				return true
			}
			collectRoutes(call.Args[1], prefix+p, add)
			return false
		case (name == "Method" || name == "MethodFunc") && len(call.Args) == 3: // chi: r.Method("GET", "/p", h)
			m, mok := methodValue(call.Args[0])
			p, pok := stringValue(call.Args[1])
			if mok && pok {
				add(route{m, normalRoute(prefix + p)})
			}
			return true
		case httpMethods[name] != "" && len(call.Args) == 2: // chi: r.Get("/p", h)
			if p, ok := stringValue(call.Args[0]); ok && strings.HasPrefix(p, "/") {
				add(route{httpMethods[name], normalRoute(prefix + p)})
			}
			return true
		case (name == "Handle" || name == "HandleFunc") && len(call.Args) == 2: // any method, or "POST /p"
			p, ok := stringValue(call.Args[0])
			if !ok {
				return true
			}
			method := ""
			if m, rest, found := strings.Cut(p, " "); found && strings.ToUpper(m) == m {
				method, p = m, strings.TrimSpace(rest)
			}
			if strings.HasPrefix(p, "/") {
				add(route{method, normalRoute(prefix + p)})
			}
			return true
		}
		return true
	})
}

// stringValue is the value of a string literal, or of a sum of literals and names (a name stands for a path
// parameter: "/function/"+name is /function/{}).
func stringValue(e ast.Expr) (string, bool) {
	switch x := e.(type) {
	case *ast.BasicLit:
		if x.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(x.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if x.Op != token.ADD {
			return "", false
		}
		l, lok := stringValue(x.X)
		r, rok := stringValue(x.Y)
		return l + r, lok && rok
	case *ast.Ident, *ast.SelectorExpr, *ast.CallExpr:
		return "{}", true
	case *ast.ParenExpr:
		return stringValue(x.X)
	}
	return "", false
}

// methodValue is an HTTP method written as a literal ("GET") or as net/http's constant (http.MethodGet).
func methodValue(e ast.Expr) (string, bool) {
	switch x := e.(type) {
	case *ast.BasicLit:
		s, err := strconv.Unquote(x.Value)
		return strings.ToUpper(s), err == nil
	case *ast.SelectorExpr:
		if m, ok := strings.CutPrefix(x.Sel.Name, "Method"); ok {
			return strings.ToUpper(m), true
		}
	}
	return "", false
}

// pythonRoute is a route a Python function's handler compares its path with: a string literal of a path.
var pythonRoute = regexp.MustCompile(`["'](/v1/[A-Za-z0-9_/.{}-]*)["']`)

// functionRoutes are the /v1 routes the functions' handlers (functions/*/handler.py) serve (the llm function's
// OpenAI API): any method, as the handler checks it itself.
func functionRoutes(t *testing.T) map[route]string {
	t.Helper()
	files, err := filepath.Glob("../../functions/*/handler.py")
	if err != nil {
		t.Fatal(err)
	}
	out := map[route]string{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range pythonRoute.FindAllStringSubmatch(string(src), -1) {
			out[route{"", normalRoute(m[1])}] = strings.TrimPrefix(f, "../../")
		}
	}
	return out
}

// docRoute is a /v1 route in a document's text, with the method written before it, if any. It starts after a
// space, a quote, a bracket or a table's bar, never inside a longer path or URL (/function/llm/v1/...).
var docRoute = regexp.MustCompile("(?:^|[\\s`'\"(\\[|,])(?:(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) +)?(/v1/[A-Za-z0-9_{}<>:./-]*[A-Za-z0-9_}>])")

// TestDocsNameServedRoutes: every /v1/... route the README, docs/*.md and the functions' and chart's READMEs
// name is one the code registers: the gpuserver API's (gpuserver/api), the provider's and the queue worker's
// routes, or a function's own (the llm function's OpenAI paths in functions/llm/handler.py); where a doc writes
// the method (POST /v1/...), a route of that method. The routes are read from the Go source's syntax (go/ast), not from a list kept beside it.
func TestDocsNameServedRoutes(t *testing.T) {
	served := registeredRoutes(t, "gpuserver", "provider", "queueworker", "cmd")
	if _, ok := served[route{"POST", "/v1/functions/{}/acquire"}]; !ok {
		t.Fatalf("the routes read from the code lack the gpuserver's acquire: %v", served)
	}
	for r, f := range functionRoutes(t) {
		served[r] = f
	}
	named := 0
	for _, doc := range docsWithReferences(t) {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			for _, m := range docRoute.FindAllStringSubmatch(line, -1) {
				named++
				method, path := m[1], normalRoute(m[2])
				if !servedRoute(served, method, path) {
					t.Errorf("%s:%d names %s, which no code registers (served /v1 routes: %s)",
						strings.TrimPrefix(doc, "../../"), i+1, strings.TrimSpace(method+" "+m[2]), v1Routes(served))
				}
			}
		}
	}
	if named < 10 {
		t.Fatalf("the docs name only %d /v1 routes: the extraction broke", named)
	}
}

// servedRoute says whether a route of method (any, when "") and path is served.
func servedRoute(served map[route]string, method, path string) bool {
	for r := range served {
		if r.path == path && (method == "" || r.method == "" || r.method == method) {
			return true
		}
	}
	return false
}

func v1Routes(served map[route]string) string {
	var out []string
	for r := range served {
		if strings.HasPrefix(r.path, "/v1/") {
			out = append(out, strings.TrimSpace(r.method+" "+r.path))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
