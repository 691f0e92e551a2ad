package imagebuild

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func spec(t *testing.T) Spec {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Spec{
		Ref: "faas-gpu.test/unit:dev",
		Entries: []Entry{
			{Path: "/usr/local/bin/tool", Source: bin},
			{Path: "/etc/motd", Data: []byte("hello\n")},
			{Path: "/home/app", Dir: true, UID: 100, GID: 101},
			{Path: "/home/app/tool", Link: "/usr/local/bin/tool"},
		},
		Env: []string{"A=1"}, User: "100:101", WorkingDir: "/home/app", Entrypoint: []string{"/usr/local/bin/tool"},
	}
}

// TestImageLayerAndConfig builds an image and reads back its layer and config.
func TestImageLayerAndConfig(t *testing.T) {
	s := spec(t)
	img, err := s.Image()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "100:101" || cfg.Config.WorkingDir != "/home/app" || cfg.Config.Entrypoint[0] != "/usr/local/bin/tool" {
		t.Errorf("config %+v", cfg.Config)
	}
	got := map[string]*tar.Header{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[strings.TrimSuffix(h.Name, "/")] = h
	}
	for name, check := range map[string]func(*tar.Header) bool{
		"usr/local/bin/tool": func(h *tar.Header) bool { return h.Typeflag == tar.TypeReg && h.Mode == 0o755 },
		"etc/motd":           func(h *tar.Header) bool { return h.Size == 6 && h.Mode == 0o644 },
		"home/app":           func(h *tar.Header) bool { return h.Typeflag == tar.TypeDir && h.Uid == 100 && h.Gid == 101 },
		"home/app/tool":      func(h *tar.Header) bool { return h.Typeflag == tar.TypeSymlink && h.Linkname == "/usr/local/bin/tool" },
		"usr/local/bin":      func(h *tar.Header) bool { return h.Typeflag == tar.TypeDir },
	} {
		if h, ok := got[name]; !ok || !check(h) {
			t.Errorf("%s: %+v", name, h)
		}
	}
}

// TestReproducible: the same spec gives the same digest and key; a changed file changes both.
func TestReproducible(t *testing.T) {
	s := spec(t)
	d1, k1 := digestAndKey(t, s)
	d2, k2 := digestAndKey(t, s)
	if d1 != d2 || k1 != k2 {
		t.Fatalf("two builds differ: %s %s / %s %s", d1, k1, d2, k2)
	}
	if err := os.WriteFile(s.Entries[0].Source, []byte("changed"), 0o755); err != nil {
		t.Fatal(err)
	}
	d3, k3 := digestAndKey(t, s)
	if d3 == d1 || k3 == k1 {
		t.Errorf("a changed file kept the digest %s or key %s", d3, k3)
	}
}

func digestAndKey(t *testing.T, s Spec) (string, string) {
	t.Helper()
	img, err := s.Image()
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.Key()
	if err != nil {
		t.Fatal(err)
	}
	return d.String(), k
}

// TestWriteArchive writes a docker archive that go-containerregistry reads back with the same digest.
func TestWriteArchive(t *testing.T) {
	s := spec(t)
	p := filepath.Join(t.TempDir(), "img.tar")
	d, err := s.WriteArchive(p)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	built, _ := s.Image()
	want, _ := built.ConfigName()
	if cfg != want || d.String() == "" {
		t.Errorf("archive config %s, built %s", cfg, want)
	}
}

func TestValidateRefusesBadSpecs(t *testing.T) {
	for name, mutateSpec := range map[string]func(*Spec){
		"relative path": func(s *Spec) { s.Entries[0].Path = "usr/bin/x" },
		"duplicate":     func(s *Spec) { s.Entries[1].Path = s.Entries[0].Path },
		"file and link": func(s *Spec) { s.Entries[1].Link = "/x" },
		"bad env":       func(s *Spec) { s.Env = []string{"NOVALUE"} },
		"bad ref":       func(s *Spec) { s.Ref = "UPPER CASE" },
	} {
		s := spec(t)
		mutateSpec(&s)
		if err := s.Validate(); !errors.Is(err, ErrSpec) {
			t.Errorf("%s: %v; want ErrSpec", name, err)
		}
	}
}
