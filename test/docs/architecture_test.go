package docs

import (
	"cmp"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoPath matches a `quoted` path of the repository in a document: it starts with one of the repository's top
// folders.
var repoPath = regexp.MustCompile("`((?:cmd|connlimit|contract|provider|gpuserver|queueworker|shim|template|test|docs|charts|functions)(?:/[A-Za-z0-9_./{}-]*[A-Za-z0-9_])?)`")

// TestArchitectureNamesExistingFiles: every file and package docs/architecture.md and docs/design.md name exists,
// so that the map cannot point at code that moved.
func TestArchitectureNamesExistingFiles(t *testing.T) {
	for _, doc := range []string{"architecture.md", "design.md"} {
		src, err := os.ReadFile(filepath.Join("../../docs", doc))
		if err != nil {
			t.Fatal(err)
		}
		named := repoPath.FindAllStringSubmatch(string(src), -1)
		if doc == "architecture.md" && len(named) < 100 {
			t.Fatalf("docs/architecture.md names only %d paths", len(named))
		}
		for _, m := range named {
			if strings.Contains(m[1], "{") { // a route, not a path
				continue
			}
			if _, err := os.Stat(filepath.Join("../..", m[1])); err != nil {
				t.Errorf("docs/%s names %s, which does not exist", doc, m[1])
			}
		}
	}
}

// TestArchitectureMapsEveryPackage: every package of the product (not tests, benchmarks or tools) is named in
// docs/architecture.md, so that a new package is placed on the map when it is added.
func TestArchitectureMapsEveryPackage(t *testing.T) {
	src, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range repoPath.FindAllStringSubmatch(string(src), -1) {
		named[m[1]] = true
	}
	packages := map[string]bool{}
	goSources(t, func(path string) bool { return !strings.HasSuffix(path, "_test.go") }, func(path, _ string) {
		dir := filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../../")))
		if strings.HasPrefix(dir, "test/") || strings.HasPrefix(dir, "shim/") || strings.Contains(dir, "/cmd/") ||
			strings.Contains(dir, "/internal/") || strings.Contains(dir, "bench") {
			return
		}
		packages[dir] = true
	})
	if len(packages) < 40 {
		t.Fatalf("found only %d packages: %v", len(packages), packages)
	}
	for dir := range packages {
		if !named[dir] {
			t.Errorf("package %s is not on the map: add it to docs/architecture.md's packages", dir)
		}
	}
}

// section is the part of doc from the heading start to the next heading of the same or a higher level (the end
// of the document when there is none).
func section(t *testing.T, doc, start string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+start+"\n")
	if i < 0 {
		i = strings.Index(doc, "\n"+start)
	}
	if i < 0 {
		t.Fatalf("docs/architecture.md has no section %q", start)
		return ""
	}
	level := strings.Index(start, " ")
	rest := doc[i+1+len(start):]
	for _, l := range []string{"\n# ", "\n## ", "\n### ", "\n#### "}[:level] {
		if j := strings.Index(rest, l); j >= 0 {
			rest = rest[:j]
		}
	}
	return doc[i+1 : i+1+len(start)+len(rest)]
}

// namesInOrder checks that text names each of names (in code spans), each after the one before it.
func namesInOrder(t *testing.T, what, text string, names ...string) {
	t.Helper()
	rest := text
	for _, n := range names {
		i := strings.Index(rest, "`"+n+"`")
		if i < 0 {
			t.Errorf("%s does not name %s after %s", what, n, strings.Join(names[:slices.Index(names, n)], ", "))
			continue
		}
		rest = rest[i:]
	}
}

// TestArchitectureFollowsTheRequest: the map follows a request as it runs in the default mode (executor processes
// per tenant): the synchronous request in its two phases, decision (gateway, provider, function, the gpuserver's
// acquire, the controller) then hold (the actuator's swap, the hold in the executor, the handler's calls, the
// release), each naming its files and frames in the order they run; a swap-in after an eviction; the
// asynchronous path through the queue worker's gateway.sock and why it has two queues. And the walks name the
// file of every function they name, so that a reader never opens a file the map does not name.
func TestArchitectureFollowsTheRequest(t *testing.T) {
	src, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(src)
	walks := section(t, doc, "## A request, call by call")
	first := section(t, walks, "### Before the first request: hello, hand-off, initialisation")
	sync := section(t, walks, "### Synchronous: `POST /function/{name}`")
	decision := section(t, sync, "#### Decision: gateway -> provider -> function -> gpuserver acquire -> controller")
	hold := section(t, sync, "#### Hold: the actuator's swap and hold, the executor, the release")
	back := section(t, sync, "#### The back-channels")
	swapIn := section(t, walks, "### A swap-in after an eviction")
	async := section(t, walks, "### Asynchronous: `POST /async-function/{name}`")

	namesInOrder(t, "the session's start", first, "shim/src/transport.c", "gpuserver/remoting/session.go",
		"gpuserver/remoting/handoff.go", "tenant.Plane.HandOff", "handoff.OpSession",
		"gpuserver/tenantexec/handlers.go", "remoting.Server.Adopt", "deviceHandler.bind", "handoff.OpBindImplicit",
		"trackedPool.BindImplicit")
	namesInOrder(t, "the decision", decision, "cmd/faas-gpu/up.go", "provider/handlers/proxy.go",
		"template/gpu-python/index.py", "gpuserver/api/api.go", "trackedPool.Acquire", "trackedPool.noteHealth",
		"controller.Pool.Acquire", "controller.Controller.Submit", "controller.Controller.Dispatch")
	// In process mode the end of initialisation is not a frame of its own: it rides in the hold's.
	if strings.Contains(decision+hold, "handoff.KindEndInit") {
		t.Error("the request walk sends handoff.KindEndInit, which the default mode never sends (tenantPlane's EndInit does nothing)")
	}
	namesInOrder(t, "the hold", hold, "controller.Pool.actuate", "handoff.OpEvict", "handoff.OpSwapIn",
		"gpuserver/tenant/handoff/plane.go", "gpuserver/executor/swap.go", "handoff.OpAcquire",
		"executor.Node.EndInit", "executor.Node.Acquire", "shim/src/transport.c", "gpuserver/remoting/session.go",
		"gpuserver/executor/binding.go", "gpuserver/device/stream.go", "handoff.OpRelease",
		"controller.Pool.Release")
	for _, frame := range []string{"handoff.OpBorrow", "handoff.OpReclaim", "handoff.OpBindImplicit",
		"handoff.EventEvicted", "handoff.EventGPUFailed", "trackedPool.noteHealth"} {
		namesInOrder(t, "the back-channels", back, frame)
	}
	namesInOrder(t, "the swap-in after an eviction", swapIn, "controller.Controller.Dispatch", "handoff.OpEvict",
		"executor.Node.Evict", "handoff.OpSwapIn", "executor.Node.completeLocked", "handoff.OpBorrow",
		"handoff.OpAcquire", "executor.Stream.gate")
	namesInOrder(t, "the asynchronous request", async, "queueworker/frontdoor/frontdoor.go",
		"queueworker/worker/pull.go", "queueworker/worker/dispatch.go", "gateway.sock",
		"queueworker/worker/complete.go")
	if !strings.Contains(async, "**Why two SLO queues") {
		t.Error("the asynchronous path does not say why it runs two SLO queues (the worker's and the controller's)")
	}

	// One sequence picture per process crossing: a message between the two processes in some diagram.
	diagrams := sequenceDiagrams(walks)
	for _, crossing := range [][2]string{{"client", "faas-gpu up"}, {"faas-gpu up", "function process"},
		{"function process", "gpuserver"}, {"function process", "tenant executor"}, {"gpuserver", "tenant executor"},
		{"queue worker", "faas-gpu up"}, {"queue worker", "NATS"}} {
		if !crossed(diagrams, crossing[0], crossing[1]) {
			t.Errorf("no sequence diagram of the request walks has a message between %s and %s", crossing[0],
				crossing[1])
		}
	}

	// The walks name the file of every function, type or method they name.
	ix := repoIndex(t)
	files := map[string]bool{}
	for _, m := range repoPath.FindAllStringSubmatch(walks, -1) {
		files[m[1]] = true
	}
	if len(files) < 60 {
		t.Errorf("the request walks name %d files, want the whole path (60 or more)", len(files))
	}
	missing := map[string][]string{}
	for _, r := range goReferences("docs/architecture.md", walks) {
		decl, ok := declFiles(ix, r.ref)
		if !ok {
			continue // not the repository's Go (TestDocsNameCodeThatExists checks it exists)
		}
		if !slices.ContainsFunc(decl, func(f string) bool { return files[f] }) {
			missing[decl[0]] = append(missing[decl[0]], r.ref)
		}
	}
	for file, refs := range missing {
		slices.Sort(refs)
		t.Errorf("the request walks name %s but not %s, the file that declares it", strings.Join(slices.Compact(refs), ", "), file)
	}
}

// seqDiagram is a Mermaid sequence diagram: its participants' labels by alias, and its messages.
type seqDiagram struct {
	labels   map[string]string
	messages [][2]string // from, to (aliases)
}

var (
	participantLine = regexp.MustCompile(`^\s*participant\s+(\S+)(?:\s+as\s+(.+))?$`)
	messageLine     = regexp.MustCompile(`^\s*([A-Za-z0-9_]+)\s*-{1,2}>>?\+?-?\s*([A-Za-z0-9_]+)\s*:`)
)

// sequenceDiagrams parses the Mermaid sequence diagrams of a text.
func sequenceDiagrams(text string) []seqDiagram {
	var out []seqDiagram
	var cur *seqDiagram
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "```mermaid":
			out = append(out, seqDiagram{labels: map[string]string{}})
			cur = &out[len(out)-1]
		case trimmed == "```":
			cur = nil
		case cur != nil:
			if m := participantLine.FindStringSubmatch(line); m != nil {
				cur.labels[m[1]] = cmp.Or(m[2], m[1])
			} else if m := messageLine.FindStringSubmatch(line); m != nil {
				cur.messages = append(cur.messages, [2]string{m[1], m[2]})
			}
		}
	}
	return out
}

// crossed says whether a diagram has a message between participants labelled a and b (either way).
func crossed(diagrams []seqDiagram, a, b string) bool {
	for _, d := range diagrams {
		for _, m := range d.messages {
			from, to := d.labels[m[0]], d.labels[m[1]]
			if strings.Contains(from, a) && strings.Contains(to, b) || strings.Contains(from, b) && strings.Contains(to, a) {
				return true
			}
		}
	}
	return false
}

// declFiles are the files of the repository that may declare ref (a package's function, type or variable, a
// type's method or field), false when ref is not the repository's.
func declFiles(ix *goIndex, ref string) ([]string, bool) {
	parts := strings.Split(ref, ".")
	var out []string
	for _, p := range ix.byName[parts[0]] {
		file, ok := p.decls[parts[1]]
		if !ok {
			continue
		}
		if ty := p.types[parts[1]]; ty != nil && len(parts) > 2 {
			if f, ok := ix.member(ty, parts[2], map[*goType]bool{}); ok {
				file = f
			}
		}
		out = append(out, path.Join(p.dir, path.Base(file)))
	}
	if len(out) == 0 && len(ix.byName[parts[0]]) == 0 {
		for _, ty := range ix.types[parts[0]] {
			if f, ok := ix.member(ty, parts[1], map[*goType]bool{}); ok {
				out = append(out, f)
			}
		}
	}
	return out, len(out) > 0
}

// mainPackage matches the package clause of a program.
var mainPackage = regexp.MustCompile(`(?m)^package main$`)

// TestProgramsLiveOutsideTheProduct: a program (package main) lives under cmd/ (the binaries and tools a user
// runs) or test/ (tests' helpers, benchmarks in test/bench/<name>), or is shim/gen (the generator beside the table
// it reads); never inside a product package, where a benchmark or a tool would be mistaken for the product's code.
func TestProgramsLiveOutsideTheProduct(t *testing.T) {
	mains := 0
	goSources(t, func(path string) bool { return !strings.HasSuffix(path, "_test.go") }, func(path, src string) {
		if !mainPackage.MatchString(src) {
			return
		}
		mains++
		dir := filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../../")))
		if !strings.HasPrefix(dir, "cmd/") && !strings.HasPrefix(dir, "test/") && dir != "shim/gen" {
			t.Errorf("%s is a program inside a product package: move it to cmd/ or test/bench/", path)
		}
	})
	if mains < 10 {
		t.Fatalf("found only %d files of programs", mains)
	}
}

// TestArchitectureNamesEveryFrame: every operation of the control socket between the gpuserver and its executors
// (the Op and Event variables of gpuserver/tenant/handoff's table) and every kind of frame it declares is in the
// map's table of frames, so that an operation added to the seam is placed on the map with who sends it and why.
func TestArchitectureNamesEveryFrame(t *testing.T) {
	src, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	table := section(t, string(src), "### The control socket's frames")
	p := repoIndex(t).pkgs["gpuserver/tenant/handoff"]
	if p == nil {
		t.Fatal("package gpuserver/tenant/handoff not found: the frames moved, update this test")
	}
	counts := map[string]int{}
	for name := range p.decls {
		for _, prefix := range []string{"Kind", "Op", "Event"} {
			if len(name) <= len(prefix) || !strings.HasPrefix(name, prefix) || !upper(name[len(prefix):]) {
				continue
			}
			counts[prefix]++
			if !strings.Contains(table, "`handoff."+name+"`") {
				t.Errorf("handoff.%s is not in docs/architecture.md's table of the control socket's frames", name)
			}
		}
	}
	if counts["Kind"] < 20 || counts["Op"]+counts["Event"] < 20 {
		t.Fatalf("found only %v kinds and operations in gpuserver/tenant/handoff", counts)
	}
}
