package docs

import (
	"os"
	"path/filepath"
	"regexp"
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

// TestArchitectureFollowsTheRequest: the synchronous request path names the files of every process it crosses,
// in order: provider, template, gpuserver API, controller, hand-off, tenant executor, shim, remoting, executor,
// device.
func TestArchitectureFollowsTheRequest(t *testing.T) {
	src, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(src)
	start := strings.Index(doc, "### Synchronous")
	end := strings.Index(doc, "### Asynchronous")
	if start < 0 || end < start {
		t.Fatal("docs/architecture.md has no synchronous request path before the asynchronous one")
	}
	path := doc[start:end]
	rest := path
	for _, file := range []string{"provider/handlers/proxy.go", "template/gpu-python/index.py",
		"gpuserver/api/api.go", "gpuserver/controller/controller.go", "gpuserver/tenant/handoff/control.go",
		"gpuserver/tenantexec/handlers.go", "shim/src/transport.c", "gpuserver/remoting/session.go",
		"gpuserver/executor/binding.go", "gpuserver/device/stream.go"} {
		i := strings.Index(rest, "`"+file+"`")
		if i < 0 {
			t.Errorf("the request path does not name %s after the files before it in the path", file)
			continue
		}
		rest = rest[i:]
	}
	files := map[string]bool{}
	for _, m := range repoPath.FindAllStringSubmatch(path, -1) {
		if strings.Contains(m[1], ".") {
			files[m[1]] = true
		}
	}
	if len(files) < 20 {
		t.Errorf("the request path names %d files, want the whole path (20 or more)", len(files))
	}
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
