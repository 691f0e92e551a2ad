package venv

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
)

// What an install runs with. The code an install runs is chosen by whoever wrote the requirements (an sdist's
// setup.py, a build backend), so where functions are sandboxed (Config.Sandbox) the install is too: python -m venv
// and pip run in a sandbox of their own that shows the system read-only, the base interpreter, the requirements
// file and the folders and files pip's settings name (wheel folders, certificates, a pip.conf), and lets them write
// only the environment being built and a temporary folder on disk beside it; as root under ids of their own, which
// no function holds. Their environment holds the machine's variables and pip's and the proxies' settings, nothing
// else of this process. Once pip has ended (and with it every process of its sandbox), the environment is sealed:
// owned by this process's user, no set-id bits, nothing writable by others; functions see it read-only.

// buildSuffix names an install's work folder beside its environment:
//
//	py3.11-<key>.build/requirements.txt   the normalised requirements pip installs (read-only to pip)
//	py3.11-<key>.build/tmp/               pip's temporary files and home, on disk (torch's wheels take gigabytes)
//	py3.11-<key>.build/root/              the install's sandbox root is mounted here, in its own mount namespace
//
// It is made before the environment's folder and removed after the environment's marker is written, so an
// environment with a build folder beside it is never complete: an interrupted install cannot leave a marker the
// install's own code wrote behind as the real one.
const buildSuffix = ".build"

// installHostname is the UTS name inside an install's sandbox.
const installHostname = "faas-gpu-install"

// Variables of this process an install sees besides the machine's (PATH, LANG, LANGUAGE, LC_*, TZ).
var (
	// pipSettings are pip's and the proxies' settings passed unchanged.
	pipSettings = []string{"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_NO_INDEX",
		"PIP_FIND_LINKS", "PIP_PREFER_BINARY", "PIP_ONLY_BINARY", "PIP_NO_BINARY", "PIP_PRE", "PIP_DEFAULT_TIMEOUT",
		"PIP_TIMEOUT", "PIP_RETRIES", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy",
		"https_proxy", "no_proxy", "all_proxy"}
	// pipFiles are settings that name a local file or folder: it is shown read-only (a relative path is made
	// absolute against this process's working directory).
	pipFiles = []string{"PIP_CERT", "PIP_CLIENT_CERT", "PIP_CONFIG_FILE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE",
		"SSL_CERT_DIR", "CURL_CA_BUNDLE"}
	// pipLocations are settings that hold space-separated URLs or local paths (file: URLs or paths are shown).
	pipLocations = []string{"PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"}
	// installSystemFiles are files of the machine pip reads beside SystemPaths: its system-wide configuration and
	// the operating system's name (its user agent).
	installSystemFiles = []string{"/etc/pip.conf", "/etc/xdg/pip", "/etc/os-release", "/etc/lsb-release",
		"/etc/debian_version"}
)

// machineVar reports whether a variable describes the machine (where programs are, the language, the time zone).
func machineVar(k string) bool {
	switch k {
	case "PATH", "LANG", "LANGUAGE", "TZ":
		return true
	}
	return strings.HasPrefix(k, "LC_")
}

// installEnv is the environment of a sandboxed install: the machine's variables and pip's settings from environ,
// with home and temporary folder tmp, pip's cache off (it would only double the bytes written into tmp) and pip's
// progress rendered. shown are the local files and folders its settings name.
func installEnv(environ []string, tmp string) (env, shown []string) {
	vars := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if ok && (machineVar(k) || slices.Contains(pipSettings, k) || slices.Contains(pipFiles, k)) {
			vars[k] = v
		}
	}
	for _, k := range pipFiles {
		if v := vars[k]; v != "" {
			abs, err := filepath.Abs(v)
			if err != nil {
				delete(vars, k)
				continue
			}
			vars[k] = abs
			shown = append(shown, abs)
		}
	}
	for _, k := range pipLocations {
		if v, ok := vars[k]; ok {
			var out []string
			for _, loc := range strings.Fields(v) {
				loc, path := localLocation(loc)
				out = append(out, loc)
				if path != "" {
					shown = append(shown, path)
				}
			}
			vars[k] = strings.Join(out, " ")
		}
	}
	vars["HOME"], vars["TMPDIR"], vars["PIP_NO_CACHE_DIR"] = tmp, tmp, "1"
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return append(env, pipProgressEnv...), shown
}

// localLocation reads one of pip's locations (a URL or a path): loc is it with a relative path made absolute,
// path the local file or folder it names ("" for a remote URL).
func localLocation(loc string) (string, string) {
	if u, err := url.Parse(loc); err == nil && u.Scheme != "" && len(u.Scheme) > 1 { // not C:
		if u.Scheme == "file" && u.Path != "" {
			return loc, filepath.Clean(u.Path)
		}
		return loc, ""
	}
	abs, err := filepath.Abs(loc)
	if err != nil {
		return loc, ""
	}
	return abs, abs
}

// installer is one sandboxed install: the sandbox, who it runs as, what it sees.
type installer struct {
	sb      *sandbox.Sandbox
	id      sandbox.Identity
	release func()
	env     []string
	build   string   // the work folder (buildSuffix)
	shown   []string // read-only
	target  string   // the environment's folder, writable
}

// newInstaller prepares the work folder of an install of env (which must not exist yet, nor its build folder),
// and the environment's empty folder, both writable by the identity the install borrows from the sandbox.
func newInstaller(sb *sandbox.Sandbox, env *Env, req Requirements, py interp, environ []string) (*installer, error) {
	build := env.Dir + buildSuffix
	tmp := filepath.Join(build, "tmp")
	reqPath := filepath.Join(build, "requirements.txt")
	vars, shown := installEnv(environ, tmp)
	in := &installer{sb: sb, env: vars, build: build, target: env.Dir}
	in.shown = append(append(append(sandbox.SystemPaths(), installSystemFiles...), py.prefixes...), reqPath)
	// Only the operator's settings name folders the install sees; the requirements name none (Parse refuses a
	// local --find-links, --index-url or path: shown, the state dir would be readable to the install's code).
	in.shown = append(in.shown, shown...)
	in.id, in.release = sb.Borrow("install " + env.Name)
	ok := false
	defer func() {
		if !ok {
			in.release()
		}
	}()
	if err := os.Mkdir(build, 0o700); err != nil {
		return nil, err
	}
	for _, d := range []string{tmp, filepath.Join(build, "root")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(reqPath, []byte(req.Text()), 0o644); err != nil {
		return nil, err
	}
	if err := os.Mkdir(env.Dir, 0o755); err != nil {
		return nil, err
	}
	if in.chowns() {
		for _, d := range []string{tmp, env.Dir} {
			if err := os.Lchown(d, int(in.id.UID), int(in.id.GID)); err != nil {
				return nil, err
			}
		}
	}
	ok = true
	return in, nil
}

// chowns reports whether the install runs as ids other than this process's (the platform runs as root).
func (in *installer) chowns() bool {
	return int(in.id.UID) != os.Getuid() || int(in.id.GID) != os.Getgid()
}

// command is argv run in the install's sandbox. release must be called once it has started (or failed to).
func (in *installer) command(argv []string) (*exec.Cmd, func(), error) {
	tmp := filepath.Join(in.build, "tmp")
	return in.sb.Command(sandbox.Spec{Argv: argv, Env: in.env, Dir: tmp, Root: filepath.Join(in.build, "root"),
		Hostname: installHostname, ReadOnly: in.shown, Writable: []string{in.target, tmp}, ID: in.id})
}

// close gives the borrowed identity back; every process of the install has ended.
func (in *installer) close() { in.release() }

// seal makes an environment an install built (every process of which has ended) read-only to everyone but this
// process's user: each file and folder owned by this user (when the install ran as another), folders 0755, files
// 0644 or 0755 when the install made them executable; no set-id or sticky bits, nothing writable by the group or
// others. Symbolic links are left as they are (never followed). Hard links cannot point outside: the environment
// was its own mount in the install's sandbox.
func seal(dir string, chown bool) error {
	uid, gid := os.Getuid(), os.Getgid()
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if chown {
			if err := os.Lchown(p, uid, gid); err != nil {
				return err
			}
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		switch {
		case fi.IsDir():
			mode = 0o755
		case fi.Mode().Perm()&0o111 != 0:
			mode = 0o755
		}
		if fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != mode {
			return os.Chmod(p, mode)
		}
		return nil
	})
}

// removeAll removes path like os.RemoveAll, also where an install took its own write permission from folders
// (which would leave this process, when it is not root, unable to empty them).
func removeAll(path string) error {
	err := os.RemoveAll(path)
	if err == nil {
		return nil
	}
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() && d.Type()&fs.ModeSymlink == 0 {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(path)
}

// writeFresh writes a file this process makes inside an environment: whatever is at path (a link or a folder an
// install left there) is removed first, and the file is created new, never through a link.
func writeFresh(path string, data []byte) error {
	if err := removeAll(path); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

// touch sets path's times to now without following a link; a missing file is created.
func touch(path string) error {
	err := unix.UtimesNanoAt(unix.AT_FDCWD, path, nil, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return writeFresh(path, nil)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
