package repository_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

// TestHostImages: another process reads each committed image's host bytes from the sidecars; an image being
// captured is not there yet, a deleted one is gone.
func TestHostImages(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shm")
	r, err := repository.Open(repository.Config{Dir: dir, Registrar: &registrar{live: map[*byte]int{}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	capture(t, r, "resnet", 1, 4<<20, 2<<20)
	capture(t, r, "odd/name", 2, 1<<20)
	half, err := r.Create(context.Background(), "half", []repository.Segment{{Size: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer half.Release()
	got, err := repository.HostImages(dir)
	if err != nil || len(got) != 2 || got["resnet"] != 6<<20 || got["odd/name"] != 1<<20 {
		t.Fatalf("HostImages = %v, %v", got, err)
	}
	if err := r.Delete("resnet"); err != nil {
		t.Fatal(err)
	}
	if got, err := repository.HostImages(dir); err != nil || len(got) != 1 {
		t.Fatalf("after a delete: %v, %v", got, err)
	}
}
