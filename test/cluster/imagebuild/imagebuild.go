// Package imagebuild builds OCI images without Docker for the live cluster test: a base layer (a Debian rootfs
// tarball made by debootstrap, or nothing) and one layer of files, directories and links described by a Spec, with
// the image config (environment, user, working directory, entrypoint) written by go-containerregistry. The result
// is a docker-archive tarball that `ctr -n k8s.io image import` loads into containerd.
//
// Layers are deterministic (fixed modification times, sorted entries), so the same inputs give the same image
// digest and a cached tarball or an imported image can be reused by digest.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ErrSpec is wrapped by every error about a bad Spec.
var ErrSpec = errors.New("invalid image spec")

// Entry is one thing in an image's own layer: a regular file (Source or Data), a directory (Dir) or a symbolic
// link (Link).
type Entry struct {
	// Path is the absolute path in the image.
	Path string
	// Source is a host file whose content the entry gets; Data is inline content. At most one of them.
	Source string
	Data   []byte
	// Dir makes the entry a directory; Link makes it a symbolic link to Link.
	Dir  bool
	Link string
	// Mode is the permission bits (0644 for files and 0755 for directories when zero).
	Mode int64
	// UID and GID own the entry.
	UID, GID int
}

// Spec describes one image.
type Spec struct {
	// Ref is the image's reference, e.g. faas-gpu.test/faas-gpu:dev.
	Ref string
	// Base is a rootfs tarball (plain or gzip) used as the first layer; empty for an image with one layer.
	Base string
	// Entries make up the image's own layer, in any order; parent directories are created as needed.
	Entries []Entry
	// Env holds KEY=value pairs; User, WorkingDir, Entrypoint and Cmd are the container config.
	Env        []string
	User       string
	WorkingDir string
	Entrypoint []string
	Cmd        []string
	// Ports are exposed ports such as "8080/tcp" (documentation only, as in a Dockerfile).
	Ports []string
}

// created is the fixed time of every entry and of the image, so that builds are reproducible.
var created = time.Unix(0, 0).UTC()

// Validate checks the spec without reading files.
func (s Spec) Validate() error {
	if _, err := name.NewTag(s.Ref, name.WeakValidation); err != nil {
		return fmt.Errorf("%w: Ref %q: %w", ErrSpec, s.Ref, err)
	}
	seen := map[string]bool{}
	for _, e := range s.Entries {
		if !path.IsAbs(e.Path) || path.Clean(e.Path) != e.Path || e.Path == "/" {
			return fmt.Errorf("%w: %s: entry path %q is not a clean absolute path", ErrSpec, s.Ref, e.Path)
		}
		if seen[e.Path] {
			return fmt.Errorf("%w: %s: entry %s appears twice", ErrSpec, s.Ref, e.Path)
		}
		seen[e.Path] = true
		kinds := 0
		for _, b := range []bool{e.Source != "" || e.Data != nil, e.Dir, e.Link != ""} {
			if b {
				kinds++
			}
		}
		if kinds > 1 {
			return fmt.Errorf("%w: %s: entry %s is more than one of file, directory and link", ErrSpec, s.Ref, e.Path)
		}
		if e.Source != "" && e.Data != nil {
			return fmt.Errorf("%w: %s: entry %s has both Source and Data", ErrSpec, s.Ref, e.Path)
		}
	}
	for _, kv := range s.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("%w: %s: env %q is not KEY=value", ErrSpec, s.Ref, kv)
		}
	}
	return nil
}

// Paths lists the image paths of the spec's own layer, sorted: what a Dockerfile describing the same image must
// also produce.
func (s Spec) Paths() []string {
	out := make([]string, 0, len(s.Entries))
	for _, e := range s.Entries {
		out = append(out, e.Path)
	}
	sort.Strings(out)
	return out
}

// Image builds the image the spec describes.
func (s Spec) Image() (v1.Image, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var layers []v1.Layer
	if s.Base != "" {
		base, err := tarball.LayerFromFile(s.Base, tarball.WithCompressedCaching)
		if err != nil {
			return nil, fmt.Errorf("%s: base layer %s: %w", s.Ref, s.Base, err)
		}
		layers = append(layers, base)
	}
	own, err := s.layer()
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(own)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, fmt.Errorf("%s: layer: %w", s.Ref, err)
	}
	layers = append(layers, layer)
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", s.Ref, err)
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: created}
	cfg.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, s.Env...)
	cfg.Config.User = s.User
	cfg.Config.WorkingDir = s.WorkingDir
	cfg.Config.Entrypoint = s.Entrypoint
	cfg.Config.Cmd = s.Cmd
	if len(s.Ports) > 0 {
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range s.Ports {
			cfg.Config.ExposedPorts[p] = struct{}{}
		}
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", s.Ref, err)
	}
	return img, nil
}

// WriteArchive builds the image and writes it as a docker-archive tarball to dst (through a temporary file, so a
// partial archive never has dst's name). It returns the image's manifest digest.
func (s Spec) WriteArchive(dst string) (v1.Hash, error) {
	img, err := s.Image()
	if err != nil {
		return v1.Hash{}, err
	}
	tag, err := name.NewTag(s.Ref, name.WeakValidation)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%w: Ref %q: %w", ErrSpec, s.Ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%s: digest: %w", s.Ref, err)
	}
	tmp := dst + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return v1.Hash{}, fmt.Errorf("%s: write %s: %w", s.Ref, dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return v1.Hash{}, err
	}
	return digest, nil
}

// layer writes the spec's entries (and the parent directories they need) as an uncompressed tar.
func (s Spec) layer() ([]byte, error) {
	entries := map[string]Entry{}
	for _, e := range s.Entries {
		entries[e.Path] = e
		for dir := path.Dir(e.Path); dir != "/"; dir = path.Dir(dir) {
			if _, ok := entries[dir]; !ok {
				entries[dir] = Entry{Path: dir, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := entries[p]
		hdr := &tar.Header{
			Name: strings.TrimPrefix(p, "/"), Mode: e.Mode, Uid: e.UID, Gid: e.GID,
			ModTime: created, Format: tar.FormatPAX,
		}
		var data []byte
		switch {
		case e.Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
		case e.Link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Link
			hdr.Mode = 0o777
		default:
			hdr.Typeflag = tar.TypeReg
			data = e.Data
			if e.Source != "" {
				b, err := os.ReadFile(e.Source)
				if err != nil {
					return nil, fmt.Errorf("%s: entry %s: %w", s.Ref, p, err)
				}
				data = b
				if hdr.Mode == 0 {
					if fi, err := os.Stat(e.Source); err == nil && fi.Mode()&0o111 != 0 {
						hdr.Mode = 0o755
					}
				}
			}
			if hdr.Mode == 0 {
				hdr.Mode = 0o644
			}
			hdr.Size = int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("%s: entry %s: %w", s.Ref, p, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("%s: entry %s: %w", s.Ref, p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Key is a digest of everything that decides the image (the spec and the content of every file it reads), so a
// cached archive can be found without building the image again.
func (s Spec) Key() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "ref=%s\nuser=%s\nwd=%s\nentry=%q\ncmd=%q\nenv=%q\nports=%q\n",
		s.Ref, s.User, s.WorkingDir, s.Entrypoint, s.Cmd, s.Env, s.Ports)
	if s.Base != "" {
		fi, err := os.Stat(s.Base)
		if err != nil {
			return "", fmt.Errorf("%s: base: %w", s.Ref, err)
		}
		// The base is a cached tarball rebuilt only when deleted: its name, size and time identify it.
		fmt.Fprintf(h, "base=%s %d %d\n", s.Base, fi.Size(), fi.ModTime().UnixNano())
	}
	es := append([]Entry(nil), s.Entries...)
	sort.Slice(es, func(i, j int) bool { return es[i].Path < es[j].Path })
	for _, e := range es {
		fmt.Fprintf(h, "entry=%s dir=%t link=%s mode=%o uid=%d gid=%d\n", e.Path, e.Dir, e.Link, e.Mode, e.UID, e.GID)
		data := e.Data
		if e.Source != "" {
			b, err := os.ReadFile(e.Source)
			if err != nil {
				return "", fmt.Errorf("%s: entry %s: %w", s.Ref, e.Path, err)
			}
			data = b
			if fi, err := os.Stat(e.Source); err == nil {
				fmt.Fprintf(h, "exec=%t\n", fi.Mode()&0o111 != 0)
			}
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(h, "data=%x\n", sum)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// DirEntries lists the regular files under dir as entries below dst (dst/relative path), owned by uid:gid, with
// modes from the files (executable or not).
func DirEntries(dir, dst string, uid, gid int) ([]Entry, error) {
	var out []Entry
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "__pycache__" {
				if p != dir {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%w: %s is not a regular file", ErrSpec, p)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		out = append(out, Entry{Path: path.Join(dst, filepath.ToSlash(rel)), Source: p, UID: uid, GID: gid})
		return nil
	})
	return out, err
}
