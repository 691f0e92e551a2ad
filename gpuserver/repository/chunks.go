package repository

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Content-addressed chunks (Tangram's reuse of identical tensors).
//
// A committed image is stored as chunks of Config.ChunkBytes (the GPU's mapping granularity), each segment cut
// from its own start, each chunk a shared-memory file named for the SHA-256 of the image's sharing domain and the
// chunk's bytes: images whose segments hold identical chunks (variants of one base model that differ in their
// head) hold each such chunk in host memory once. An image's bytes stay one contiguous range of the gpuserver's
// address space: its chunk files are mapped side by side (MAP_FIXED) into a reserved range, so the swap code reads
// them as before, and the range is registered (page-locked) as a whole.
//
// Sharing domain: chunks are shared only between images of one domain (the executor passes the function's tenant:
// its namespace, or itself when isolated). Sharing across tenants would let one tenant tell, from swap times or
// memory figures, whether another's image holds given bytes; and a GPU serves one tenant at a time, so chunks of
// two tenants are never resident together to share anyway.
//
// A chunk file is removed when the last image that holds it is dropped or spilled. Committed images are never
// written (the swap code only reads them); a chunk is compared byte for byte with the bytes it is to stand for
// before it is shared, so a hash collision cannot mix two images.

// DefaultChunkBytes is the chunk size when Config.ChunkBytes is 0: the GPUs' 2 MiB mapping granularity.
const DefaultChunkBytes = 2 << 20

// chunkKey names a chunk of domain with bytes b.
func chunkKey(domain string, b []byte) string {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write([]byte{0})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func (r *Repository) chunkDir() string { return filepath.Join(r.cfg.Dir, "chunks") }

func (r *Repository) chunkPath(key string) string { return filepath.Join(r.chunkDir(), key) }

// alignUp rounds n up to a multiple of a.
func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

// chunkRanges are the [off, off+size) ranges of segment s's chunks, relative to the segment.
func (r *Repository) chunkRanges(s Segment) [][2]uint64 {
	var out [][2]uint64
	for off := uint64(0); off < s.Size; off += r.cfg.ChunkBytes {
		out = append(out, [2]uint64{off, min(r.cfg.ChunkBytes, s.Size-off)})
	}
	return out
}

// storeChunksLocked writes (or finds) the chunks of im's flat data and records their keys in im.meta; it takes a
// reference on each. On error the references taken are given back.
func (r *Repository) storeChunksLocked(im *Image) error {
	if err := os.MkdirAll(r.chunkDir(), 0o700); err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	var taken []string
	undo := func(err error) error {
		for _, k := range taken {
			r.unrefLocked(k)
		}
		for i := range im.meta.Segments {
			im.meta.Segments[i].Chunks = nil
		}
		return err
	}
	for i, s := range im.meta.Segments {
		keys := make([]string, 0, (s.Size+r.cfg.ChunkBytes-1)/r.cfg.ChunkBytes)
		for _, cr := range r.chunkRanges(s) {
			b := im.data[s.Offset+cr[0] : s.Offset+cr[0]+cr[1]]
			k := chunkKey(im.meta.Domain, b)
			if r.chunkRefs[k] > 0 {
				same, err := sameBytes(r.chunkPath(k), b)
				if err != nil {
					return undo(fmt.Errorf("repository: chunk %s: %w", k, err))
				}
				if !same { // a hash collision: keep this image flat rather than mix two images' bytes
					return undo(fmt.Errorf("%w: chunk %s differs from bytes with its hash", ErrInvalid, k))
				}
			} else if err := writeChunk(r.chunkPath(k), b); err != nil {
				return undo(fmt.Errorf("repository: chunk %s: %w", k, err))
			}
			r.refLocked(k, uint64(len(b)))
			taken = append(taken, k)
			keys = append(keys, k)
		}
		im.meta.Segments[i].Chunks = keys
	}
	return nil
}

func (r *Repository) refLocked(key string, size uint64) {
	if r.chunkRefs[key] == 0 {
		r.chunkSize[key] = size
		r.stats.HostBytes += size
		r.stats.Chunks++
	}
	r.chunkRefs[key]++
}

// unrefLocked drops a reference; the last one removes the chunk's file.
func (r *Repository) unrefLocked(key string) {
	if r.chunkRefs[key] == 0 {
		return
	}
	r.chunkRefs[key]--
	if r.chunkRefs[key] == 0 {
		r.stats.HostBytes -= r.chunkSize[key]
		r.stats.Chunks--
		delete(r.chunkRefs, key)
		delete(r.chunkSize, key)
		_ = os.Remove(r.chunkPath(key))
	}
}

// chunked reports whether m's bytes live in chunks (images committed before chunks existed are one flat file).
func (m *meta) chunked() bool { return len(m.Segments) > 0 && len(m.Segments[0].Chunks) > 0 }

// mapChunks maps im's chunk files side by side into a reserved range and registers it.
func (r *Repository) mapChunks(im *Image) error {
	size := int(im.meta.Size)
	region, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("repository: function %s: reserve %d bytes: %w", im.meta.Function, size, err)
	}
	data := unsafe.Slice((*byte)(region), size)
	fail := func(err error) error {
		_ = unmapRegion(data)
		return err
	}
	for _, s := range im.meta.Segments {
		ranges := r.chunkRanges(s)
		if len(ranges) != len(s.Chunks) {
			return fail(fmt.Errorf("%w: function %s segment %d: %d chunks, %d expected", ErrInvalid,
				im.meta.Function, s.ID, len(s.Chunks), len(ranges)))
		}
		for j, cr := range ranges {
			f, err := os.OpenFile(r.chunkPath(s.Chunks[j]), os.O_RDWR, 0)
			if err != nil {
				return fail(fmt.Errorf("repository: function %s: %w", im.meta.Function, err))
			}
			st, err := f.Stat()
			if err == nil && uint64(st.Size()) != cr[1] {
				err = fmt.Errorf("%w: chunk %s has %d bytes, %d expected", ErrInvalid, s.Chunks[j], st.Size(), cr[1])
			}
			if err == nil {
				at := unsafe.Pointer(&data[s.Offset+cr[0]])
				_, err = unix.MmapPtr(int(f.Fd()), 0, at, uintptr(cr[1]), unix.PROT_READ|unix.PROT_WRITE,
					unix.MAP_SHARED|unix.MAP_FIXED)
			}
			f.Close()
			if err != nil {
				return fail(fmt.Errorf("repository: function %s: map chunk %s: %w", im.meta.Function, s.Chunks[j], err))
			}
		}
	}
	if r.cfg.Registrar != nil {
		if err := r.cfg.Registrar.RegisterHost(data); err != nil {
			return fail(fmt.Errorf("repository: function %s: register host memory: %w%s", im.meta.Function, err,
				pinnableHint(r.cfg.Dir)))
		}
	}
	im.data = data
	return nil
}

// ChunkKeys returns the content keys of segment i's chunks (index into Segments), one per Config.ChunkBytes from
// the segment's start; nil for an image stored flat. Equal keys in two images of one domain mean equal bytes.
func (im *Image) ChunkKeys(i int) []string {
	return append([]string(nil), im.meta.Segments[i].Chunks...)
}

// ChunkBytes is the size of the image's chunks.
func (im *Image) ChunkBytes() uint64 { return im.r.cfg.ChunkBytes }

// unmapRegion unmaps a range mapChunks mapped (syscall.Munmap knows only its own mappings).
func unmapRegion(data []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(&data[0]), uintptr(len(data)))
}

func writeChunk(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func sameBytes(path string, b []byte) (bool, error) {
	got, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	return bytes.Equal(got, b), nil
}
