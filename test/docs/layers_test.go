package docs

import (
	"sort"
	"strings"
	"testing"
)

// dataPlaneLayers are the packages of the data plane: what moves bytes on the GPUs and keeps images.
var dataPlaneLayers = []string{"gpuserver/executor", "gpuserver/memory", "gpuserver/repository", "gpuserver/device"}

// policyLayers are the packages above the data plane: the policy, the server that assembles the node and the
// gpuserver's side of the tenant executors.
var policyLayers = []string{"gpuserver/controller", "gpuserver/server", "gpuserver/tenant"}

// knownLayerExceptions are imports between the layers that exist and are to go, each with why: key
// "importer -> imported" (direct imports, non-test files). None is left: executor.Actuator, the adapter that made
// gpuserver/executor import gpuserver/controller, became the server's planeActuator.
var knownLayerExceptions = map[string]string{}

// under says whether dir is pkg or a package below it.
func under(dir, pkg string) bool { return dir == pkg || strings.HasPrefix(dir, pkg+"/") }

// TestDataPlaneImportsNoPolicy: the data plane (gpuserver/executor, memory, repository, device and the packages
// below them) imports none of gpuserver/controller, gpuserver/server, gpuserver/tenant (nor a package below
// them), directly or through another package of the module: the data plane carries decisions out, it does not
// make them, and the simulator and the executor processes link it without the policy or the server. The imports
// are read from the non-test files' syntax (go/parser); a test may import anything.
func TestDataPlaneImportsNoPolicy(t *testing.T) {
	ix := repoIndex(t)
	for _, base := range append(append([]string(nil), dataPlaneLayers...), policyLayers...) {
		if ix.pkgs[base] == nil {
			t.Fatalf("package %s not found: the layers of this test moved", base)
		}
	}
	used := map[string]bool{}
	for dir := range ix.pkgs {
		if !inLayer(dir, dataPlaneLayers) {
			continue
		}
		// Breadth-first over the module's imports from dir, remembering how each package was reached.
		from := map[string]string{dir: ""}
		queue := []string{dir}
		for len(queue) > 0 {
			cur := queue[0]
			queue = queue[1:]
			p := ix.pkgs[cur]
			if p == nil {
				continue
			}
			imps := make([]string, 0, len(p.imports))
			for imp := range p.imports {
				imps = append(imps, imp)
			}
			sort.Strings(imps)
			for _, imp := range imps {
				if _, seen := from[imp]; seen {
					continue
				}
				edge := cur + " -> " + imp
				if inLayer(imp, policyLayers) {
					if _, ok := knownLayerExceptions[edge]; ok {
						used[edge] = true
						continue
					}
					from[imp] = cur
					t.Errorf("%s imports %s: %s", dir, imp, chain(from, imp))
					continue
				}
				from[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	for edge, why := range knownLayerExceptions {
		if !used[edge] {
			t.Errorf("the known exception %s (%s) no longer exists: remove it from knownLayerExceptions", edge, why)
		}
	}
}

func inLayer(dir string, layers []string) bool {
	for _, l := range layers {
		if under(dir, l) {
			return true
		}
	}
	return false
}

// chain is how imp was reached: a -> b -> imp.
func chain(from map[string]string, imp string) string {
	path := []string{imp}
	for cur := from[imp]; cur != ""; cur = from[cur] {
		path = append([]string{cur}, path...)
	}
	return strings.Join(path, " -> ")
}
