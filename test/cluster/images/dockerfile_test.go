package images

import (
	"archive/tar"
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/test/cluster/imagebuild"
)

// The Dockerfiles stay the documented way to build the images; these tests check that each spec the cluster test
// builds without Docker lays out the same files, environment, user and working directory.

// layout is what a Dockerfile's final stage puts in the image, as far as these images use the instructions.
type layout struct {
	paths   map[string]bool
	env     map[string]string
	user    string
	workdir string
}

// dockerLayout reads the final stage of a Dockerfile (and the stages it starts FROM) with context as the build
// context directory.
func dockerLayout(t *testing.T, dockerfile, context string) layout {
	t.Helper()
	f, err := os.Open(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type stage struct {
		from string
		ins  [][]string
	}
	stages := map[string]*stage{}
	var cur *stage
	var line strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasSuffix(l, `\`) {
			line.WriteString(strings.TrimSuffix(l, `\`) + " ")
			continue
		}
		line.WriteString(l)
		words := strings.Fields(line.String())
		line.Reset()
		switch strings.ToUpper(words[0]) {
		case "FROM":
			cur = &stage{}
			args := dropFlags(words[1:])
			cur.from = args[0]
			name := "final"
			if len(args) == 3 && strings.EqualFold(args[1], "AS") {
				name = args[2]
			}
			stages[name] = cur
			stages["final"] = cur
		case "ARG":
			if cur == nil {
				continue
			}
			fallthrough
		default:
			cur.ins = append(cur.ins, words)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// The final stage, preceded by the stages it builds on.
	var chain []*stage
	for s := stages["final"]; s != nil; s = stages[s.from] {
		chain = append([]*stage{s}, chain...)
		if stages[s.from] == s {
			break
		}
	}
	l := layout{paths: map[string]bool{}, env: map[string]string{}, workdir: "/"}
	abs := func(p string) string {
		if path.IsAbs(p) {
			return path.Clean(p)
		}
		return path.Join(l.workdir, p)
	}
	for _, s := range chain {
		for _, w := range s.ins {
			switch strings.ToUpper(w[0]) {
			case "WORKDIR":
				l.workdir = abs(w[1])
				l.paths[l.workdir] = true
			case "USER":
				l.user = w[1]
			case "ENV":
				for _, m := range envPair.FindAllStringSubmatch(strings.Join(w[1:], " "), -1) {
					l.env[m[1]] = strings.Trim(m[2], `"`)
				}
			case "COPY":
				from := strings.Contains(strings.Join(w, " "), "--from=")
				args := dropFlags(w[1:])
				dst, srcs := args[len(args)-1], args[:len(args)-1]
				dir := strings.HasSuffix(dst, "/") || dst == "." || len(srcs) > 1
				for _, src := range srcs {
					local := filepath.Join(context, src)
					if fi, err := os.Stat(local); !from && err == nil && fi.IsDir() {
						ents, err := imagebuild.DirEntries(local, abs(dst), 0, 0)
						if err != nil {
							t.Fatal(err)
						}
						for _, e := range ents {
							l.paths[e.Path] = true
						}
						continue
					}
					if dir {
						l.paths[path.Join(abs(dst), path.Base(src))] = true
					} else {
						l.paths[abs(dst)] = true
					}
				}
			case "RUN":
				runLayout(&l, strings.Join(w[1:], " "), abs)
			}
		}
	}
	return l
}

// envPair is one KEY=value of an ENV instruction; a value may be double-quoted.
var envPair = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S+)`)

// runLayout records what the shell commands of one RUN add: links, directories, empty files, users.
func runLayout(l *layout, script string, abs func(string) string) {
	for _, cmd := range strings.Split(script, "&&") {
		f := strings.Fields(cmd)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "ln":
			if len(f) == 4 && f[1] == "-s" {
				l.paths[abs(f[3])] = true
			}
		case "mkdir":
			for _, a := range f[1:] {
				if !strings.HasPrefix(a, "-") {
					l.paths[abs(a)] = true
				}
			}
		case "touch":
			for _, a := range f[1:] {
				l.paths[abs(a)] = true
			}
		case "groupadd", "addgroup", "useradd", "adduser":
			l.paths["/etc/passwd"], l.paths["/etc/group"] = true, true
			for i, a := range f {
				if a == "--home-dir" && i+1 < len(f) {
					l.paths[f[i+1]] = true
				}
			}
			if f[0] == "adduser" && len(f) > 1 {
				l.paths["/home/"+f[1]] = true
			}
		}
	}
}

func dropFlags(words []string) []string {
	var out []string
	for _, w := range words {
		if !strings.HasPrefix(w, "--") {
			out = append(out, w)
		}
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// comparePaths returns the paths only one side has, less the declared exceptions.
func comparePaths(docker map[string]bool, spec imagebuild.Spec, onlyDocker, onlySpec []string) (problems []string) {
	built := map[string]bool{}
	for _, p := range spec.Paths() {
		built[p] = true
	}
	skipD := map[string]bool{}
	for _, p := range onlyDocker {
		skipD[p] = true
		if built[p] {
			problems = append(problems, fmt.Sprintf("%s is declared Dockerfile-only but the builder has it", p))
		}
	}
	skipS := map[string]bool{}
	for _, p := range onlySpec {
		skipS[p] = true
		if docker[p] {
			problems = append(problems, fmt.Sprintf("%s is declared builder-only but the Dockerfile has it", p))
		}
	}
	for _, p := range sortedKeys(docker) {
		if !built[p] && !skipD[p] {
			problems = append(problems, fmt.Sprintf("the Dockerfile puts %s in the image; the builder's %s does not", p, spec.Ref))
		}
	}
	for _, p := range spec.Paths() {
		if !docker[p] && !skipS[p] {
			problems = append(problems, fmt.Sprintf("the builder's %s has %s; the Dockerfile does not", spec.Ref, p))
		}
	}
	return problems
}

// testBase is a minimal Debian-like base: the users' files the builder extends.
func testBase(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root", "etc")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "passwd"), []byte("root:x:0:0:root:/root:/bin/bash\n"), 0o644)
	os.WriteFile(filepath.Join(root, "group"), []byte("root:x:0:\n"), 0o644)
	tarPath := filepath.Join(dir, "base.tar")
	writeTar(t, tarPath, filepath.Join(dir, "root"))
	return tarPath
}

func repo(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestFaasGPUImageMatchesDockerfile(t *testing.T) {
	r := repo(t)
	spec, err := FaasGPU(testBase(t), filepath.Join(r, "go.mod"), filepath.Join(r, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	l := dockerLayout(t, filepath.Join(r, "Dockerfile"), r)
	for _, p := range comparePaths(l.paths, spec, nil, nil) {
		t.Error(p)
	}
	envKeys := map[string]bool{}
	for _, kv := range spec.Env {
		k, _, _ := strings.Cut(kv, "=")
		envKeys[k] = true
		if _, ok := l.env[k]; !ok {
			t.Errorf("builder env %s is not in the Dockerfile", k)
		}
	}
	for k := range l.env {
		if !envKeys[k] {
			t.Errorf("Dockerfile env %s is not in the builder's image", k)
		}
	}
	if l.user != spec.User || l.workdir != spec.WorkingDir {
		t.Errorf("user/workdir: Dockerfile %s %s, builder %s %s", l.user, l.workdir, spec.User, spec.WorkingDir)
	}
}

func TestGPUPythonImageMatchesDockerfile(t *testing.T) {
	r := repo(t)
	tmpl := filepath.Join(r, "templates", "gpu-python")
	spec, err := GPUPython(testBase(t), tmpl, filepath.Join(tmpl, "function"), "template")
	if err != nil {
		t.Fatal(err)
	}
	l := dockerLayout(t, filepath.Join(tmpl, "Dockerfile"), tmpl)
	// The Dockerfile's python base has /usr/local/bin/python; the Debian base gets it as a link.
	for _, p := range comparePaths(l.paths, spec, WatchdogOmitted, []string{"/usr/local/bin/python"}) {
		t.Error(p)
	}
	for _, k := range []string{"FAAS_GPU_SOCKET", "fprocess"} {
		if want := l.env[k]; !contains(spec.Env, k+"="+want) {
			t.Errorf("env %s: Dockerfile %q, builder %v", k, want, spec.Env)
		}
	}
	if l.user != "app" || spec.User != "100:101" || l.workdir != spec.WorkingDir {
		t.Errorf("user/workdir: Dockerfile %s %s, builder %s %s", l.user, l.workdir, spec.User, spec.WorkingDir)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestComparisonFindsDifferences: a file the Dockerfile adds and the builder lacks is reported.
func TestComparisonFindsDifferences(t *testing.T) {
	r := repo(t)
	spec, err := FaasGPU(testBase(t), filepath.Join(r, "go.mod"), filepath.Join(r, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	df := filepath.Join(t.TempDir(), "Dockerfile")
	b, err := os.ReadFile(filepath.Join(r, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(df, append(b, []byte("\nCOPY --from=build /out/extra /usr/local/bin/extra\n")...), 0o644)
	l := dockerLayout(t, df, r)
	if !l.paths["/usr/local/bin/extra"] {
		t.Fatal("the layout misses the added COPY")
	}
	if len(comparePaths(l.paths, spec, nil, nil)) == 0 {
		t.Error("a file only the Dockerfile has went unreported")
	}
}

// writeTar writes the files under dir as a tarball.
func writeTar(t *testing.T, dst, dir string) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: "./" + rel, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}
