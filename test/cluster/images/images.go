// Package images describes the images of the live cluster test as imagebuild specs: the faas-gpu image (binary
// and shim, as the repository's Dockerfile lays it out), gpu-python function images (the template and a handler,
// as template/gpu-python/Dockerfile lays them out), and the static images the cluster itself needs (a pause
// stand-in, NATS, CoreDNS, Knative's queue-proxy). Tests in this package check that each spec and its Dockerfile
// describe the same files.
package images

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/faas-gpu/faas-gpu/test/cluster/imagebuild"
)

// Registry is the registry name of every image the test builds; nothing is ever pulled from it (the pods use
// imagePullPolicy IfNotPresent or Never and the images are imported into containerd).
const Registry = "faas-gpu.test"

// Tag is the tag of every image the test builds.
const Tag = "dev"

// Ref returns the reference of a test image: faas-gpu.test/<name>:dev.
func Ref(name string) string { return Registry + "/" + name + ":" + Tag }

// The faas-gpu image's layout (Dockerfile): the binary, the shim, the faas-netes link in the working directory and
// the non-root user.
const (
	FaasGPUBinary  = "/usr/local/bin/faas-gpu"
	FaasGPUShim    = "/usr/local/lib/faas-gpu/libcuda.so.1"
	FaasGPUHome    = "/home/app"
	FaasGPUNetes   = "/home/app/faas-netes"
	FaasGPUUID     = 65532
	functionUID    = 100 // adduser --system app on Debian bookworm
	functionGID    = 101
	functionHome   = "/home/app"
	functionPort   = "8080"
	gpuSocketPath  = "/var/run/faas-gpu/gpuserver.sock"
	watchdogBinary = "/usr/bin/fwatchdog"
)

// WatchdogOmitted is what the gpu-python images built here leave out of template/gpu-python/Dockerfile:
// of-watchdog (the Dockerfile copies it from its image; the module is not on the Go proxy and no registry is
// reachable). The images run the template's own HTTP server (index.py) on the watchdog's port instead, which
// serves the same routes and GET /_/health.
var WatchdogOmitted = []string{watchdogBinary}

// FaasGPU is the faas-gpu image: base is the Debian rootfs tarball, binary and shim the built files.
func FaasGPU(base, binary, shim string) (imagebuild.Spec, error) {
	ref := Ref("faas-gpu")
	users, err := withUser(base, "faas-gpu", FaasGPUUID, FaasGPUUID, FaasGPUHome)
	if err != nil {
		return imagebuild.Spec{}, err
	}
	entries := append(users,
		imagebuild.Entry{Path: FaasGPUBinary, Source: binary, Mode: 0o755},
		imagebuild.Entry{Path: FaasGPUShim, Source: shim, Mode: 0o755},
		imagebuild.Entry{Path: FaasGPUHome, Dir: true, UID: FaasGPUUID, GID: FaasGPUUID},
		imagebuild.Entry{Path: FaasGPUNetes, Link: FaasGPUBinary},
	)
	return imagebuild.Spec{
		Ref: ref, Base: base, Entries: entries,
		Env:  []string{"FAAS_GPU_SHIM_IMAGE=" + ref, "FAAS_GPU_BACKEND=kubernetes"},
		User: fmt.Sprintf("%d:%d", FaasGPUUID, FaasGPUUID), WorkingDir: FaasGPUHome,
		Entrypoint: []string{FaasGPUBinary}, Cmd: []string{"--help"},
		Ports: []string{"8080/tcp", "8081/tcp"},
	}, nil
}

// GPUPython is the image of one function: the gpu-python template (templateDir) with the handler folder fnDir, as
// template/gpu-python/Dockerfile lays them out, less of-watchdog (WatchdogOmitted). A function whose
// requirements.txt names packages is refused: the image has no pip (the example functions need none).
func GPUPython(base, templateDir, fnDir, function string) (imagebuild.Spec, error) {
	for _, req := range []string{filepath.Join(templateDir, "requirements.txt"), filepath.Join(fnDir, "requirements.txt")} {
		if err := noRequirements(req); err != nil {
			return imagebuild.Spec{}, err
		}
	}
	users, err := withUser(base, "app", functionUID, functionGID, functionHome)
	if err != nil {
		return imagebuild.Spec{}, err
	}
	entries := append(users,
		imagebuild.Entry{Path: functionHome, Dir: true, UID: functionUID, GID: functionGID},
		imagebuild.Entry{Path: path.Join(functionHome, "index.py"), Source: filepath.Join(templateDir, "index.py"),
			UID: functionUID, GID: functionGID},
		imagebuild.Entry{Path: path.Join(functionHome, "requirements.txt"),
			Source: filepath.Join(templateDir, "requirements.txt"), UID: functionUID, GID: functionGID},
		imagebuild.Entry{Path: path.Join(functionHome, "function"), Dir: true, UID: functionUID, GID: functionGID},
		imagebuild.Entry{Path: path.Join(functionHome, "function", "__init__.py"), Data: []byte{},
			UID: functionUID, GID: functionGID},
	)
	fn, err := imagebuild.DirEntries(fnDir, path.Join(functionHome, "function"), functionUID, functionGID)
	if err != nil {
		return imagebuild.Spec{}, err
	}
	entries = append(entries, fn...)
	return imagebuild.Spec{
		Ref: Ref("fn-" + function), Base: base, Entries: entries,
		Env: []string{
			"FAAS_GPU_SOCKET=" + gpuSocketPath, "HOME=" + functionHome,
			"fprocess=python3 index.py",
			// Without the watchdog, index.py itself listens where the watchdog would.
			"HOST=0.0.0.0", "PORT=" + functionPort,
		},
		User: fmt.Sprintf("%d:%d", functionUID, functionGID), WorkingDir: functionHome,
		Entrypoint: []string{"python3", "index.py"},
		Ports:      []string{functionPort + "/tcp"},
	}, nil
}

// Static is an image holding one static binary at /<name>, run with args: the pause stand-in, NATS, CoreDNS and
// Knative's queue-proxy.
func Static(name, binary string, args ...string) imagebuild.Spec {
	return imagebuild.Spec{
		Ref:        Ref(name),
		Entries:    []imagebuild.Entry{{Path: "/" + name, Source: binary, Mode: 0o755}, {Path: "/tmp", Dir: true, Mode: 0o1777}},
		Entrypoint: append([]string{"/" + name}, args...),
	}
}

// noRequirements fails if a requirements.txt names any package.
func noRequirements(file string) error {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return fmt.Errorf("%w: %s names %q: the test images have no pip", imagebuild.ErrSpec, file, l)
		}
	}
	return nil
}

// withUser returns /etc/passwd and /etc/group entries: the base's files with one more user and group (what
// useradd/adduser do in the Dockerfiles).
func withUser(base, user string, uid, gid int, home string) ([]imagebuild.Entry, error) {
	files, err := readFromTar(base, "etc/passwd", "etc/group")
	if err != nil {
		return nil, err
	}
	passwd := strings.TrimRight(files["etc/passwd"], "\n") +
		fmt.Sprintf("\n%s:x:%d:%d::%s:/usr/sbin/nologin\n", user, uid, gid, home)
	group := strings.TrimRight(files["etc/group"], "\n") + fmt.Sprintf("\n%s:x:%d:\n", user, gid)
	return []imagebuild.Entry{
		{Path: "/etc/passwd", Data: []byte(passwd)},
		{Path: "/etc/group", Data: []byte(group)},
	}, nil
}

// readFromTar reads the named files (relative paths) from a plain or gzip tarball.
func readFromTar(file string, names ...string) (map[string]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(file, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		r = zr
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]string{}
	tr := tar.NewReader(r)
	for len(out) < len(names) {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		n := strings.TrimPrefix(hdr.Name, "./")
		if want[n] && hdr.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			out[n] = string(b)
		}
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("%s: no %s", file, n)
		}
	}
	return out, nil
}
