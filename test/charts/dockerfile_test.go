package charts

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/provider/kubernetes"
)

// instruction is one Dockerfile instruction after line continuations are joined.
type instruction struct {
	Line  int
	Cmd   string // upper case
	Flags map[string]string
	Args  string
}

var knownInstructions = map[string]bool{
	"FROM": true, "RUN": true, "CMD": true, "LABEL": true, "EXPOSE": true, "ENV": true, "ADD": true, "COPY": true,
	"ENTRYPOINT": true, "VOLUME": true, "USER": true, "WORKDIR": true, "ARG": true, "ONBUILD": true,
	"STOPSIGNAL": true, "HEALTHCHECK": true, "SHELL": true,
}

// parseDockerfile reads a Dockerfile: comments and blank lines dropped, backslash continuations joined, leading
// --flag=value options split off.
func parseDockerfile(path string) ([]instruction, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, rest, _ := strings.Cut(cur.String(), " ")
		ins := instruction{Line: start, Cmd: strings.ToUpper(cmd), Flags: map[string]string{}}
		rest = strings.TrimSpace(rest)
		for strings.HasPrefix(rest, "--") {
			flagText, after, _ := strings.Cut(rest, " ")
			k, v, _ := strings.Cut(strings.TrimPrefix(flagText, "--"), "=")
			ins.Flags[k] = v
			rest = strings.TrimSpace(after)
		}
		ins.Args = rest
		out = append(out, ins)
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("%s: ends inside a line continuation", path)
	}
	return out, nil
}

var imageRef = regexp.MustCompile(`^[a-z0-9${}_.\-/:]+(:[A-Za-z0-9${}_.\-]+|@sha256:[0-9a-f]{64})$`)

// checkDockerfile checks what a build engine would refuse or what would break at run time: unknown instructions,
// FROM without a pinned tag, COPY --from of an unknown stage, COPY sources missing from the context, a final stage
// without an exec-form ENTRYPOINT or CMD, or running as root.
func checkDockerfile(path, context string) (problems []string, final []instruction) {
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	ins, err := parseDockerfile(path)
	if err != nil {
		return []string{err.Error()}, nil
	}
	if len(ins) == 0 || (ins[0].Cmd != "FROM" && ins[0].Cmd != "ARG") {
		return []string{path + ": must start with ARG or FROM"}, nil
	}
	stages := map[string]bool{}
	nStages := 0
	for _, in := range ins {
		where := path + ":" + strconv.Itoa(in.Line)
		if in.Cmd == "FROM" {
			final = nil
		}
		final = append(final, in)
		if !knownInstructions[in.Cmd] {
			report("%s: unknown instruction %s", where, in.Cmd)
		}
		switch in.Cmd {
		case "FROM":
			fields := strings.Fields(in.Args)
			if len(fields) == 0 || !stages[fields[0]] && !imageRef.MatchString(fields[0]) {
				report("%s: FROM %q: want an image with a tag or digest", where, in.Args)
			}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				stages[fields[2]] = true
			} else if len(fields) != 1 {
				report("%s: FROM %q: want IMAGE [AS name]", where, in.Args)
			}
			stages[strconv.Itoa(nStages)] = true
			nStages++
		case "COPY", "ADD":
			parts := strings.Fields(in.Args)
			if len(parts) < 2 {
				report("%s: %s needs a source and a destination", where, in.Cmd)
				continue
			}
			if from, ok := in.Flags["from"]; ok {
				if !stages[from] {
					report("%s: COPY --from=%s names no earlier stage", where, from)
				}
				continue
			}
			for _, src := range parts[:len(parts)-1] {
				if strings.ContainsAny(src, "$*?[") {
					continue
				}
				if _, err := os.Stat(filepath.Join(context, src)); err != nil {
					report("%s: %s source %s is not in the build context %s", where, in.Cmd, src, context)
				}
			}
		}
	}
	var entry bool
	user := ""
	for _, in := range final {
		switch in.Cmd {
		case "ENTRYPOINT", "CMD":
			var argv []string
			if err := json.Unmarshal([]byte(in.Args), &argv); err != nil || len(argv) == 0 {
				report("%s:%d: %s %s: want the exec form, a JSON array", path, in.Line, in.Cmd, in.Args)
			}
			entry = true
		case "USER":
			user = in.Args
		}
	}
	if !entry {
		report("%s: the final stage has no ENTRYPOINT or CMD", path)
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" {
		report("%s: the final stage runs as root (USER %q)", path, user)
	}
	return problems, final
}

func requireClean(t *testing.T, path, context string) []instruction {
	t.Helper()
	problems, final := checkDockerfile(path, context)
	for _, p := range problems {
		t.Error(p)
	}
	return final
}

func TestFaasGPUDockerfile(t *testing.T) {
	final := requireClean(t, "../../Dockerfile", "../..")
	var shimCopied, faasNetes, workdir bool
	for _, in := range final {
		switch {
		case in.Cmd == "COPY" && strings.HasSuffix(in.Args, " "+kubernetes.DefaultShimPath):
			shimCopied = true
		case in.Cmd == "RUN" && strings.Contains(in.Args, "/home/app/faas-netes"):
			faasNetes = true
		case in.Cmd == "WORKDIR" && in.Args == "/home/app":
			workdir = true
		}
	}
	if !shimCopied {
		t.Errorf("the image must hold the shim at %s (the provider's default -shim-path)", kubernetes.DefaultShimPath)
	}
	if !faasNetes || !workdir {
		t.Error("the stock chart runs ./faas-netes: WORKDIR /home/app must hold a faas-netes link")
	}
}

func TestGPUPythonDockerfile(t *testing.T) {
	requireClean(t, "../../template/gpu-python/Dockerfile", "../../template/gpu-python")
}

func TestDockerfileCheckerFindsMistakes(t *testing.T) {
	dir := t.TempDir()
	bad := "FROM golang AS build\nCOPY missing.txt /x\nFROM debian:bookworm-slim\nCOPY --from=builder /x /y\nCMD faas-gpu\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	problems, _ := checkDockerfile(filepath.Join(dir, "Dockerfile"), dir)
	said := strings.Join(problems, "\n")
	for _, want := range []string{"want an image with a tag", "missing.txt", "--from=builder", "exec form", "runs as root"} {
		if !strings.Contains(said, want) {
			t.Errorf("checker missed %q; it said:\n%s", want, said)
		}
	}
}
