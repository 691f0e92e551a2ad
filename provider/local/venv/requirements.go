package venv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// MaxRequirementsFile is the largest requirements file Read accepts.
const MaxRequirementsFile = 1 << 20

// ErrInvalidRequirements: a requirements file cannot be read or holds a line the environment cache cannot key.
var ErrInvalidRequirements = errors.New("invalid requirements")

// Requirements are the pip requirements of a function, normalised: comments, blank lines and line continuations
// removed, each line trimmed. Two functions whose files differ only in comments and spacing have equal
// Requirements and share an environment.
type Requirements struct {
	// Files names the files the lines came from, relative to the build context, for messages.
	Files []string
	// Lines are the normalised lines, in file order.
	Lines []string
}

// Empty reports whether there is nothing to install.
func (r Requirements) Empty() bool { return len(r.Lines) == 0 }

// Text is the normalised requirements file pip installs, one line each.
func (r Requirements) Text() string {
	if r.Empty() {
		return ""
	}
	return strings.Join(r.Lines, "\n") + "\n"
}

// hash is the hex SHA-256 of Text.
func (r Requirements) hash() string {
	sum := sha256.Sum256([]byte(r.Text()))
	return hex.EncodeToString(sum[:])
}

// Read reads the requirements of a build context as the gpu-python image installs them: the template's
// requirements.txt, then the handler's function/requirements.txt. Missing files count as empty.
func Read(contextDir string) (Requirements, error) {
	return ReadFiles(contextDir, filepath.Join(contextDir, "requirements.txt"),
		filepath.Join(contextDir, "function", "requirements.txt"))
}

// ReadFiles reads requirements files in order; missing files count as empty. Files are named relative to base in
// messages.
func ReadFiles(base string, paths ...string) (Requirements, error) {
	var req Requirements
	for _, path := range paths {
		rel, err := filepath.Rel(base, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			rel = path
		}
		data, err := readLimited(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return Requirements{}, fmt.Errorf("%w: %s: %w", ErrInvalidRequirements, rel, err)
		}
		lines, err := Parse(rel, data)
		if err != nil {
			return Requirements{}, err
		}
		if len(lines) > 0 {
			req.Files = append(req.Files, rel)
			req.Lines = append(req.Lines, lines...)
		}
	}
	return req, nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if st.Size() > MaxRequirementsFile {
		return nil, fmt.Errorf("%d bytes, more than the %d a requirements file may have", st.Size(), MaxRequirementsFile)
	}
	buf := make([]byte, st.Size())
	n, err := f.ReadAt(buf, 0)
	if err != nil && n != len(buf) {
		return nil, err
	}
	return buf, nil
}

// Parse normalises one requirements file (name is used in errors). It refuses what the environment's key could not
// cover: other files pulled in with -r/-c, editable installs, and local paths, whose contents can change while the
// file stays the same.
func Parse(name string, data []byte) ([]string, error) {
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, fmt.Errorf("%w: %s: holds a NUL byte; a requirements file is text", ErrInvalidRequirements, name)
	}
	var out []string
	raw := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	for i := 0; i < len(raw); i++ {
		lineNo := i + 1
		line := stripComment(raw[i])
		// A backslash at the end of a line continues it on the next one (pip joins them first).
		for strings.HasSuffix(line, `\`) && i+1 < len(raw) {
			i++
			line = strings.TrimSuffix(line, `\`) + stripComment(raw[i])
		}
		line = strings.Join(strings.Fields(line), " ")
		if line == "" {
			continue
		}
		if err := checkLine(line); err != nil {
			return nil, fmt.Errorf("%w: %s line %d: %q %v", ErrInvalidRequirements, name, lineNo, line, err)
		}
		out = append(out, line)
	}
	return out, nil
}

// stripComment removes a comment: # at the start of a line or after whitespace, as pip reads it.
func stripComment(line string) string {
	if strings.HasPrefix(strings.TrimSpace(line), "#") {
		return ""
	}
	for i := 1; i < len(line); i++ {
		if line[i] == '#' && (line[i-1] == ' ' || line[i-1] == '\t') {
			return strings.TrimSpace(line[:i])
		}
	}
	return strings.TrimSpace(line)
}

func checkLine(line string) error {
	first := strings.Fields(line)[0]
	opt, _, _ := strings.Cut(first, "=")
	switch opt {
	case "-r", "--requirement", "-c", "--constraint":
		return errors.New("includes another file, which the environment's hash would not cover: list its lines here")
	case "-e", "--editable":
		return errors.New("is an editable install, which a shared environment cannot hold: name a released package")
	}
	for _, p := range []string{"-r", "-c", "-e"} { // -rfile, -cfile, -e.
		if strings.HasPrefix(first, p) && len(first) > 2 && !strings.HasPrefix(first, "--") {
			return checkLine(p + " " + first[2:])
		}
	}
	lower := strings.ToLower(line)
	if strings.HasPrefix(first, ".") || strings.HasPrefix(first, "/") || strings.HasPrefix(first, "~") ||
		strings.HasPrefix(lower, "file:") || strings.Contains(lower, "@ file:") {
		return errors.New("is a local path, which the environment's hash would not cover: name a released package")
	}
	return nil
}
