package venv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
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
// requirements.txt, then the handler's function/requirements.txt. Missing files count as empty. Both are read
// inside the context only: a link (the file itself, or function/) that leaves the context is refused, naming the
// file, and nothing of what it points at is read.
func Read(contextDir string) (Requirements, error) {
	return ReadFiles(contextDir, filepath.Join(contextDir, "requirements.txt"),
		filepath.Join(contextDir, "function", "requirements.txt"))
}

// ReadFiles reads requirements files in order; missing files count as empty. Each path must lie inside the build
// context base and is read without following a link out of it (shrinkwrap.Open); files are named relative to base
// in messages.
func ReadFiles(base string, paths ...string) (Requirements, error) {
	var parts []Requirements
	for _, path := range paths {
		rel, err := filepath.Rel(base, path)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return Requirements{}, fmt.Errorf("%w: %s is not inside %s", ErrInvalidRequirements, path, base)
		}
		req, err := ReadAs(base, filepath.ToSlash(rel), filepath.ToSlash(rel))
		if err != nil {
			return Requirements{}, err
		}
		parts = append(parts, req)
	}
	return Join(parts...), nil
}

// ReadAs reads the requirements file rel (slash-separated) inside the build context folder root, named label in
// messages; a missing file counts as empty, a link that leaves root is refused.
func ReadAs(root, rel, label string) (Requirements, error) {
	data, err := readLimited(root, rel)
	if errors.Is(err, fs.ErrNotExist) {
		return Requirements{}, nil
	}
	if err != nil {
		return Requirements{}, fmt.Errorf("%w: %s: %w", ErrInvalidRequirements, label, err)
	}
	lines, err := Parse(label, data)
	if err != nil || len(lines) == 0 {
		return Requirements{}, err
	}
	return Requirements{Files: []string{label}, Lines: lines}, nil
}

// Join is the requirements of several files, in order.
func Join(reqs ...Requirements) Requirements {
	var out Requirements
	for _, r := range reqs {
		out.Files = append(out.Files, r.Files...)
		out.Lines = append(out.Lines, r.Lines...)
	}
	return out
}

// readLimited reads rel inside root: never through a link that leaves root, never a fifo or device, at most
// MaxRequirementsFile bytes. The error says what the entry is, never what it holds.
func readLimited(root, rel string) ([]byte, error) {
	f, err := shrinkwrap.Open(root, rel)
	if err != nil {
		if errors.Is(err, shrinkwrap.ErrUnsafeEntry) {
			return nil, errors.New("a symbolic link (itself or a folder on its way) that leaves the build context: " +
				"pip reads only files inside it")
		}
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
// cover and what would let the install reach this machine's files: other files pulled in with -r/-c, editable
// installs, local paths and file: URLs (as a requirement or as the value of --find-links, --index-url,
// --extra-index-url), options pip does not read in a requirements file (its abbreviations included), and pip's
// ${VARIABLE} expansion. The error names the file, the line and the option.
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

// Check refuses requirements whose lines Parse would refuse (Requirements made without Parse, say): what an install
// is given is checked where it is installed, too.
func (r Requirements) Check() error {
	for i, line := range r.Lines {
		if err := checkLine(line); err != nil {
			return fmt.Errorf("%w: line %d of the normalised requirements (%s): %q %v", ErrInvalidRequirements, i+1,
				strings.Join(r.Files, " + "), line, err)
		}
	}
	return nil
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

// The options pip reads in a requirements file (pip's req_file.py, SUPPORTED_OPTIONS and SUPPORTED_OPTIONS_REQ,
// pip 23 to 25), and what faas-gpu makes of each. Anything else that starts with "-" is refused: pip's own parser
// would also take an abbreviation ("--find" for --find-links), which a list of refused names would miss.
var pipOptions = map[string]optionRule{
	"-i": locationOption, "--index-url": locationOption, "--pypi-url": locationOption,
	"--extra-index-url": locationOption, "-f": locationOption, "--find-links": locationOption,
	"-r": includeOption, "--requirement": includeOption, "-c": includeOption, "--constraint": includeOption,
	"-e": editableOption, "--editable": editableOption,
	"--no-index": flagOption, "--prefer-binary": flagOption, "--require-hashes": flagOption, "--pre": flagOption,
	"--no-binary": valueOption, "--only-binary": valueOption, "--trusted-host": valueOption,
	"--use-feature": valueOption, "--hash": valueOption, "--global-option": valueOption, "-C": valueOption,
	"--config-settings": valueOption,
}

type optionRule int

const (
	flagOption     optionRule = iota // takes no value
	valueOption                      // takes a value that names no file: a host, a package list, a hash, a setting
	locationOption                   // takes a URL or a path: only an http(s) URL is accepted
	includeOption                    // another requirements file: refused
	editableOption                   // an editable install: refused
)

// envVariable is what pip expands in a requirements file (${NAME}, upper case, digits and underscores).
var envVariable = regexp.MustCompile(`\$\{[A-Z0-9_]+\}`)

// fileURL finds a file: URL (also inside a VCS URL, git+file:, or after @ or =).
var fileURL = regexp.MustCompile(`(?i)(^|[\s@=+'"])file:`)

// archiveSuffixes are the names pip installs as a local archive when a file of that name exists.
var archiveSuffixes = []string{".whl", ".zip", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz", ".tar.xz", ".txz",
	".tar.lz", ".tlz"}

func checkLine(line string) error {
	if envVariable.MatchString(line) {
		return errors.New("uses pip's ${VARIABLE} expansion, which would read the install's environment and which " +
			"the environment's hash would not cover: write the value out")
	}
	fields := strings.Fields(line)
	// As pip reads a line: the requirement is everything before the first word that starts with "-", options after.
	n := 0
	for n < len(fields) && !strings.HasPrefix(fields[n], "-") {
		n++
	}
	if n > 0 {
		if err := checkRequirement(strings.Join(fields[:n], " ")); err != nil {
			return err
		}
	}
	for i := n; i < len(fields); i++ {
		word := fields[i]
		if !strings.HasPrefix(word, "-") {
			return fmt.Errorf("%q follows the options; pip would not read it as a requirement", word)
		}
		opt, val, hasVal := word, "", false
		switch {
		case strings.HasPrefix(word, "--"):
			opt, val, hasVal = strings.Cut(word, "=")
		case len(word) > 2: // -fVALUE, -rfile
			opt, val, hasVal = word[:2], word[2:], true
		}
		rule, ok := pipOptions[opt]
		if !ok {
			return fmt.Errorf("%s is not an option faas-gpu accepts in a requirements file (pip's options for "+
				"requirements files only, spelled out in full)", opt)
		}
		switch rule {
		case includeOption:
			return fmt.Errorf("%s includes another file, which the environment's hash would not cover: list its "+
				"lines here", opt)
		case editableOption:
			return fmt.Errorf("%s is an editable install, which a shared environment cannot hold: name a released "+
				"package", opt)
		case flagOption:
			if hasVal {
				return fmt.Errorf("%s takes no value", opt)
			}
			continue
		}
		if !hasVal {
			if i+1 >= len(fields) {
				return fmt.Errorf("%s needs a value", opt)
			}
			i++
			val = fields[i]
		}
		if rule == locationOption && !remoteURL(strings.Trim(val, `"'`)) {
			return fmt.Errorf("%s %s: only an http(s) URL is accepted here: a local folder, file or file: URL "+
				"is refused (the install sees none of this machine's files, and the environment's hash would not "+
				"cover them); for a wheel folder on this machine the operator sets PIP_FIND_LINKS", opt, val)
		}
	}
	return nil
}

// remoteURL reports whether s is an http or https URL with a host.
func remoteURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// checkRequirement refuses a requirement that names something on this machine: a path, an archive file, a URL
// other than a remote one (name @ URL, a bare URL, a VCS URL).
func checkRequirement(req string) error {
	localPath := errors.New("is a local path, which the install cannot see and the environment's hash would not " +
		"cover: name a released package")
	if fileURL.MatchString(req) {
		return localPath
	}
	first := strings.Fields(req)[0]
	if strings.HasPrefix(first, ".") || strings.HasPrefix(first, "/") || strings.HasPrefix(first, "~") ||
		strings.HasPrefix(first, `\`) {
		return localPath
	}
	loc := ""
	if name, rest, ok := strings.Cut(req, "@"); ok && !strings.Contains(name, "://") { // name [extras] @ URL
		if rest = strings.TrimSpace(rest); rest == "" {
			return errors.New("names no URL after @")
		}
		loc = strings.Fields(rest)[0]
	} else if strings.Contains(first, "://") || strings.Contains(first, ":") && !strings.ContainsAny(first, "<>=!~;") {
		loc = first // a URL (https://..., git+https://...)
	}
	if loc != "" {
		u, err := url.Parse(loc)
		if err != nil || u.Host == "" || strings.Contains(strings.ToLower(u.Scheme), "file") {
			return fmt.Errorf("%s: only a URL with a remote host is accepted", loc)
		}
		return nil
	}
	if strings.ContainsAny(first, `/\`) {
		return localPath
	}
	lower := strings.ToLower(first)
	for _, suffix := range archiveSuffixes {
		if strings.HasSuffix(lower, suffix) {
			return localPath
		}
	}
	return nil
}
