package handoff

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestOpsListsEveryOperation: every Op and Event declared in ops.go is in Ops, once, with a kind of its own, so that
// CheckHandlers (each side's tests) sees it; an operation declared and not listed fails here.
func TestOpsListsEveryOperation(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "ops.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			for _, v := range s.(*ast.ValueSpec).Values {
				if servesPlane(v) {
					declared++
					continue
				}
				lit, ok := v.(*ast.CompositeLit)
				if !ok {
					continue
				}
				if ix, ok := lit.Type.(*ast.IndexListExpr); ok {
					if id, ok := ix.X.(*ast.Ident); ok && id.Name == "Op" {
						declared++
					}
				}
				if ix, ok := lit.Type.(*ast.IndexExpr); ok {
					if id, ok := ix.X.(*ast.Ident); ok && id.Name == "Event" {
						declared++
					}
				}
			}
		}
	}
	ops := Ops()
	if declared == 0 || len(ops) != declared {
		t.Fatalf("ops.go declares %d operations, Ops lists %d", declared, len(ops))
	}
	seen := map[Kind]bool{}
	for _, o := range ops {
		if seen[o.Kind] {
			t.Errorf("kind %d listed twice", o.Kind)
		}
		seen[o.Kind] = true
		if o.Dir != ToExecutor && o.Dir != ToGPUServer {
			t.Errorf("kind %d has no direction", o.Kind)
		}
	}
}

// TestCheckHandlers: a table without the handler of one operation, or with a handler of none, is refused.
func TestCheckHandlers(t *testing.T) {
	all := map[Kind]Handler{}
	h := func(context.Context, Frame) (any, []*os.File, error) { return nil, nil, nil }
	for _, o := range Ops() {
		if o.Dir == ToGPUServer {
			all[o.Kind] = h
		}
	}
	if err := CheckHandlers(ToGPUServer, all); err != nil {
		t.Fatal(err)
	}
	delete(all, KindEvicted)
	if err := CheckHandlers(ToGPUServer, all); err == nil || !strings.Contains(err.Error(), "kind 47") {
		t.Fatalf("a missing handler: %v", err)
	}
	all[KindEvicted], all[KindAcquire] = h, h
	if err := CheckHandlers(ToGPUServer, all); err == nil || !strings.Contains(err.Error(), "kind 33") {
		t.Fatalf("a handler of the other side's operation: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Routes took a handler of the other direction")
		}
	}()
	Routes(ToExecutor, OpBorrow.Handle(func(context.Context, Borrow) (Lent, error) { return Lent{}, nil }))
}

// TestTypedOps: an operation's call and its handler agree on the bodies, None travels as an empty body, the
// descriptors of an answer reach the caller, an error's sentinels travel, and an event reaches its handler.
func TestTypedOps(t *testing.T) {
	mine, theirs, err := Socketpair()
	if err != nil {
		t.Fatal(err)
	}
	other, err := FileConn(theirs)
	theirs.Close()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evicted := make(chan Evicted, 1)
	gpuserver := NewPeer(other, Routes(ToGPUServer,
		OpBorrow.HandleFiles(func(_ context.Context, b Borrow, _ []*os.File) (Lent, []*os.File, error) {
			r, w, err := os.Pipe()
			if err != nil {
				return Lent{}, nil, err
			}
			_, _ = w.Write([]byte("chunk"))
			w.Close()
			return Lent{GPU: b.GPU, Indexes: []int{b.N}}, []*os.File{r}, nil
		}),
		OpReturn.Handle(func(_ context.Context, r Return) (None, error) {
			if len(r.Indexes) == 0 {
				return None{}, executor.ErrInvalid
			}
			return None{}, nil
		}),
		EventEvicted.Handle(func(_ context.Context, e Evicted) error { evicted <- e; return nil }),
	), Codes, nil)
	go func() { _ = gpuserver.Serve(ctx) }()
	exec := NewPeer(mine, nil, Codes, nil)
	go func() { _ = exec.Serve(ctx) }()
	defer func() { _ = exec.Close(); <-gpuserver.Done(); <-exec.Done() }()

	lent, files, err := OpBorrow.CallFiles(ctx, exec, Borrow{GPU: 1, N: 7}, nil)
	if err != nil || len(files) != 1 || lent.GPU != 1 || len(lent.Indexes) != 1 || lent.Indexes[0] != 7 {
		t.Fatalf("borrow: %+v %d files %v", lent, len(files), err)
	}
	got, _ := io.ReadAll(files[0])
	files[0].Close()
	if string(got) != "chunk" {
		t.Fatalf("the descriptor read %q", got)
	}
	if _, err := OpReturn.Call(ctx, exec, Return{GPU: 1, Indexes: []int{7}}); err != nil {
		t.Fatal(err)
	}
	if _, err := OpReturn.Call(ctx, exec, Return{GPU: 1}); !errors.Is(err, executor.ErrInvalid) {
		t.Fatalf("an error answer: %v", err)
	}
	if _, err := OpBindImplicit.Call(ctx, exec, Name{Function: "f"}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("an operation without a handler: %v", err)
	}
	if err := EventEvicted.Notify(exec, Evicted{GPU: 2, Function: "f", Reason: "pressure"}); err != nil {
		t.Fatal(err)
	}
	if e := <-evicted; e.GPU != 2 || e.Function != "f" {
		t.Fatalf("event %+v", e)
	}
	// None is an empty body on the wire, as the untyped frames had.
	if b, err := Encode(KindStatus, 0, 1, body(None{})); err != nil || len(b) != HeaderSize {
		t.Fatalf("a None body: %d bytes, %v", len(b), err)
	}
}

// TestEveryOperationHasACaller: the side that sends an operation (the gpuserver's package tenant for ToExecutor,
// the executor's package tenantexec for ToGPUServer) uses it, so that no operation is declared with one end only
// (each side's TestEveryOperationHasItsHandler checks the other end).
func TestEveryOperationHasACaller(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "ops.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	dirOf := map[string]string{} // operation -> its direction's name
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, v := range vs.Values {
				if servesPlane(v) {
					dirOf[vs.Names[i].Name] = "ToExecutor"
				}
				if lit, ok := v.(*ast.CompositeLit); ok && len(lit.Elts) == 2 {
					if id, ok := lit.Elts[1].(*ast.Ident); ok {
						dirOf[vs.Names[i].Name] = id.Name
					}
				}
			}
		}
	}
	if len(dirOf) != len(Ops()) {
		t.Fatalf("found %d operations in ops.go, Ops lists %d", len(dirOf), len(Ops()))
	}
	used := map[string]map[string]bool{"ToExecutor": uses(t, ".."), "ToGPUServer": uses(t, "../../tenantexec")}
	for name, dir := range dirOf {
		if used[dir] == nil {
			t.Fatalf("%s: direction %s", name, dir)
		}
		if !used[dir][name] {
			t.Errorf("handoff.%s (%s) is sent nowhere by its sending side", name, dir)
		}
	}
}

// servesPlane says whether v declares a data-plane operation (Serve or ServeAnswer, plane.go).
func servesPlane(v ast.Expr) bool {
	c, ok := v.(*ast.CallExpr)
	if !ok {
		return false
	}
	fun := c.Fun
	if ix, ok := fun.(*ast.IndexListExpr); ok {
		fun = ix.X
	}
	if ix, ok := fun.(*ast.IndexExpr); ok {
		fun = ix.X
	}
	id, ok := fun.(*ast.Ident)
	return ok && (id.Name == "Serve" || id.Name == "ServeAnswer")
}

// uses lists the names of package handoff that the non-test sources of dir use.
func uses(t *testing.T, dir string) map[string]bool {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "handoff" {
						out[sel.Sel.Name] = true
					}
				}
				return true
			})
		}
	}
	return out
}
