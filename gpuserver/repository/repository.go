// Package repository keeps each function's model image in host memory (docs/design.md, decision 3): the bytes of the
// function's model segments, captured at the end of its initialisation, authoritative from then on. An image
// lives in a shared-memory file (by default under /dev/shm) that is mapped into the gpuserver and registered with
// the device backend (page-locked), so swap-ins copy from it by DMA, and so that a gpuserver restart finds it again
// (Open restores every committed image). A host memory budget bounds the images held in shared memory: when it is
// exceeded, the least recently used images that nobody holds are spilled to a disk directory and loaded back on
// their next use; spills are counted (Stats, and the faas_gpu_repository_spills_total metric).
package repository

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Errors of the repository.
var (
	ErrNotFound = errors.New("no image for function")
	ErrInvalid  = errors.New("invalid image")
	// ErrBudget: the image cannot fit the host memory budget even after spilling everything not held.
	ErrBudget = errors.New("host memory budget exceeded")
)

// Registrar page-locks host memory for DMA (device.Backend satisfies it).
type Registrar interface {
	RegisterHost(buf []byte) error
	UnregisterHost(buf []byte) error
}

// Config configures a Repository.
type Config struct {
	// Dir holds the shared-memory image files; it should be on a tmpfs such as /dev/shm. Required.
	Dir string
	// SpillDir holds images spilled to disk; required when BudgetBytes > 0.
	SpillDir string
	// BudgetBytes bounds the image bytes held in shared memory; 0 means no bound.
	BudgetBytes uint64
	// Registrar, when set, page-locks each image while it is mapped.
	Registrar Registrar
	// Registerer, when set, receives the repository's metrics.
	Registerer prometheus.Registerer
	// Now is the clock for least-recently-used order; time.Now when nil.
	Now func() time.Time
	// ChunkBytes is the size of the content-addressed chunks images are stored in (chunks.go); 0 means
	// DefaultChunkBytes. It must be a multiple of the host page size.
	ChunkBytes uint64
}

// Segment is one model segment of an image.
type Segment struct {
	// ID of the segment in the function's address space.
	ID int `json:"id"`
	// Ptr is the segment's fixed device address.
	Ptr device.Ptr `json:"ptr"`
	// Size in bytes.
	Size uint64 `json:"size"`
	// Offset of the segment's bytes in the image (a multiple of the chunk size).
	Offset uint64 `json:"offset"`
	// Chunks are the content keys of the segment's chunks once the image is committed (chunks.go).
	Chunks []string `json:"chunks,omitempty"`
}

// meta is the sidecar file of an image.
type meta struct {
	Function string    `json:"function"`
	Domain   string    `json:"domain,omitempty"` // chunks are shared within a domain only (chunks.go)
	Size     uint64    `json:"size"`
	Segments []Segment `json:"segments"`
	Spilled  bool      `json:"spilled"`
	Captured time.Time `json:"captured"`
}

// Stats are the repository's counters.
type Stats struct {
	Images int `json:"images"`
	// HostBytes is the shared memory the images take: each chunk held by several images counted once.
	HostBytes uint64 `json:"host_bytes"`
	// LogicalBytes is the bytes of the images held in shared memory, each counted whole: LogicalBytes -
	// HostBytes is what sharing chunks saves.
	LogicalBytes uint64 `json:"logical_bytes"`
	// Chunks is the count of distinct chunks held.
	Chunks       int    `json:"chunks"`
	SpilledBytes uint64 `json:"spilled_bytes"`
	Spills       int64  `json:"spills"`
	Loads        int64  `json:"loads"`
}

// Repository holds the model images of a node's functions. It is safe for concurrent use.
type Repository struct {
	cfg     Config
	spills  prometheus.Counter
	hostGa  prometheus.Gauge
	mu      sync.Mutex
	images  map[string]*Image
	pending map[*Image]struct{} // created, not yet committed
	stats   Stats

	chunkRefs map[string]int    // chunk key -> images holding it (chunks.go)
	chunkSize map[string]uint64 // chunk key -> its bytes
}

// Image is one function's model image.
type Image struct {
	r        *Repository
	meta     meta
	data     []byte // mapped shared memory; nil while spilled
	holders  int
	lastUsed time.Time
	commited bool
}

// Function the image belongs to.
func (im *Image) Function() string { return im.meta.Function }

// Segments of the image in ID order.
func (im *Image) Segments() []Segment { return append([]Segment(nil), im.meta.Segments...) }

// Size is the image's byte count.
func (im *Image) Size() uint64 { return im.meta.Size }

// Bytes returns the host memory of segment i (index into Segments). It is valid while the image is held.
func (im *Image) Bytes(i int) []byte {
	s := im.meta.Segments[i]
	return im.data[s.Offset : s.Offset+s.Size]
}

// Open restores the committed images in cfg.Dir (and those spilled to cfg.SpillDir); uncommitted image files
// are removed.
func Open(cfg Config) (*Repository, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: repository dir is empty", ErrInvalid)
	}
	if cfg.BudgetBytes > 0 && cfg.SpillDir == "" {
		return nil, fmt.Errorf("%w: a host memory budget needs a spill dir", ErrInvalid)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ChunkBytes == 0 {
		cfg.ChunkBytes = DefaultChunkBytes
	}
	if cfg.ChunkBytes%uint64(os.Getpagesize()) != 0 {
		return nil, fmt.Errorf("%w: chunk size %d is not a multiple of the page size", ErrInvalid, cfg.ChunkBytes)
	}
	for _, d := range []string{cfg.Dir, cfg.SpillDir} {
		if d == "" {
			continue
		}
		if err := PrivateDir(d); err != nil {
			return nil, err
		}
	}
	r := &Repository{cfg: cfg, images: map[string]*Image{}, pending: map[*Image]struct{}{},
		chunkRefs: map[string]int{}, chunkSize: map[string]uint64{},
		spills: prometheus.NewCounter(prometheus.CounterOpts{Name: "faas_gpu_repository_spills_total",
			Help: "Model images spilled from host memory to disk under the host memory budget."}),
		hostGa: prometheus.NewGauge(prometheus.GaugeOpts{Name: "faas_gpu_repository_host_bytes",
			Help: "Bytes of model images held in shared host memory."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.spills, r.hostGa} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("repository: metrics: %w", err)
			}
		}
	}
	metas, err := filepath.Glob(filepath.Join(cfg.Dir, "*.meta.json"))
	if err != nil {
		return nil, fmt.Errorf("repository: %w", err)
	}
	for _, mp := range metas {
		raw, err := os.ReadFile(mp)
		if err != nil {
			return nil, fmt.Errorf("repository: %w", err)
		}
		var m meta
		if err := json.Unmarshal(raw, &m); err != nil || m.Function == "" {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, mp, err)
		}
		im := &Image{r: r, meta: m, commited: true, lastUsed: cfg.Now()}
		switch {
		case !m.Spilled && m.chunked():
			for _, sg := range m.Segments {
				for j, cr := range r.chunkRanges(sg) {
					if j < len(sg.Chunks) {
						r.refLocked(sg.Chunks[j], cr[1])
					}
				}
			}
			if err := r.mapChunks(im); err != nil {
				return nil, err
			}
			r.stats.LogicalBytes += m.Size
		case !m.Spilled:
			if err := r.mapImage(im, r.shmPath(m.Function)); err != nil {
				return nil, err
			}
		default:
			r.stats.SpilledBytes += m.Size
		}
		r.images[m.Function] = im
	}
	// chunk files no committed image holds are leftovers of an interrupted commit
	chunks, _ := filepath.Glob(filepath.Join(r.chunkDir(), "*"))
	for _, p := range chunks {
		if r.chunkRefs[filepath.Base(p)] == 0 {
			_ = os.Remove(p)
		}
	}
	// image files without a committed sidecar are leftovers of an interrupted capture
	imgs, _ := filepath.Glob(filepath.Join(cfg.Dir, "*.img"))
	for _, p := range imgs {
		if _, err := os.Stat(strings.TrimSuffix(p, ".img") + ".meta.json"); errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(p)
		}
	}
	r.hostGa.Set(float64(r.stats.HostBytes))
	return r, nil
}

var safeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$`)

func fileName(function string) string {
	if safeName.MatchString(function) {
		return function
	}
	return fmt.Sprintf("x-%x", function)
}

func (r *Repository) shmPath(function string) string {
	return filepath.Join(r.cfg.Dir, fileName(function)+".img")
}
func (r *Repository) metaPath(function string) string {
	return filepath.Join(r.cfg.Dir, fileName(function)+".meta.json")
}
func (r *Repository) spillPath(function string) string {
	return filepath.Join(r.cfg.SpillDir, fileName(function)+".img")
}

// mapImage maps the file at path as im's data and registers it.
func (r *Repository) mapImage(im *Image, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("repository: function %s: %w", im.meta.Function, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	if uint64(st.Size()) != im.meta.Size {
		return fmt.Errorf("%w: function %s: file has %d bytes, image %d", ErrInvalid, im.meta.Function, st.Size(),
			im.meta.Size)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(im.meta.Size), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("repository: function %s: mmap: %w", im.meta.Function, err)
	}
	if r.cfg.Registrar != nil {
		if err := r.cfg.Registrar.RegisterHost(data); err != nil {
			_ = syscall.Munmap(data)
			return fmt.Errorf("repository: function %s: register host memory: %w%s", im.meta.Function, err,
				pinnableHint(filepath.Dir(path)))
		}
	}
	im.data = data
	r.stats.HostBytes += im.meta.Size
	r.stats.LogicalBytes += im.meta.Size
	return nil
}

func (r *Repository) unmapImage(im *Image) error {
	if im.data == nil {
		return nil
	}
	var errs []error
	if r.cfg.Registrar != nil {
		errs = append(errs, r.cfg.Registrar.UnregisterHost(im.data))
	}
	if im.meta.chunked() {
		errs = append(errs, unmapRegion(im.data))
	} else {
		errs = append(errs, syscall.Munmap(im.data))
	}
	im.data = nil
	r.stats.LogicalBytes -= im.meta.Size
	if !im.meta.chunked() { // a chunked image's chunks are counted by their references (chunks.go)
		r.stats.HostBytes -= im.meta.Size
	}
	return errors.Join(errs...)
}

// unrefChunksLocked gives back the chunks of a chunked image that is no longer held in shared memory.
func (r *Repository) unrefChunksLocked(im *Image) {
	for i, sg := range im.meta.Segments {
		for _, k := range sg.Chunks {
			r.unrefLocked(k)
		}
		im.meta.Segments[i].Chunks = nil
	}
}

// Create makes a new, held image of the given model segments for function (replacing an existing image when
// committed). Fill its bytes (Bytes), then Commit; Release it when done. Its chunks are shared with no other
// image: CreateIn names a sharing domain.
func (r *Repository) Create(ctx context.Context, function string, segments []Segment) (*Image, error) {
	return r.CreateIn(ctx, function, "\x00"+function, segments)
}

// CreateIn is Create for an image whose chunks are shared with the other images of domain (chunks.go).
func (r *Repository) CreateIn(ctx context.Context, function, domain string, segments []Segment) (*Image, error) {
	if function == "" {
		return nil, fmt.Errorf("%w: function name is empty", ErrInvalid)
	}
	m := meta{Function: function, Domain: domain, Captured: r.cfg.Now()}
	for _, s := range segments {
		if s.Size == 0 {
			return nil, fmt.Errorf("%w: function %s: segment %d is empty", ErrInvalid, function, s.ID)
		}
		s.Offset = alignUp(m.Size, r.cfg.ChunkBytes)
		s.Chunks = nil
		m.Size = s.Offset + s.Size
		m.Segments = append(m.Segments, s)
	}
	if m.Size == 0 {
		return nil, fmt.Errorf("%w: function %s: image has no segments", ErrInvalid, function)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.makeRoomLocked(ctx, m.Size, function); err != nil {
		return nil, err
	}
	path := r.shmPath(function) + ".new"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("repository: %w", err)
	}
	err = f.Truncate(int64(m.Size))
	f.Close()
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("repository: function %s: size image: %w", function, err)
	}
	im := &Image{r: r, meta: m, holders: 1, lastUsed: r.cfg.Now()}
	if err := r.mapImage(im, path); err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	r.pending[im] = struct{}{}
	r.hostGa.Set(float64(r.stats.HostBytes))
	return im, nil
}

// Commit makes a created image the function's image, durable across restarts.
func (im *Image) Commit() error {
	r := im.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if im.commited {
		return fmt.Errorf("%w: function %s: committed twice", ErrInvalid, im.meta.Function)
	}
	if old, ok := r.images[im.meta.Function]; ok {
		if old.holders > 0 {
			return fmt.Errorf("%w: function %s: the previous image is in use", ErrInvalid, im.meta.Function)
		}
		if err := r.dropLocked(old); err != nil {
			return err
		}
	}
	if err := r.chunkLocked(im, r.shmPath(im.meta.Function)+".new"); err != nil {
		return err
	}
	if err := r.writeMeta(im.meta); err != nil {
		return err
	}
	im.commited = true
	delete(r.pending, im)
	r.images[im.meta.Function] = im
	return nil
}

// chunkLocked stores the flat image file at flat as chunks and maps im from them (the file is removed). When the
// chunks cannot be stored (a hash collision), the image stays one flat file, renamed to the function's.
func (r *Repository) chunkLocked(im *Image, flat string) error {
	if err := r.storeChunksLocked(im); err != nil {
		if !errors.Is(err, ErrInvalid) {
			return err
		}
		return os.Rename(flat, r.shmPath(im.meta.Function))
	}
	var errs []error
	if r.cfg.Registrar != nil {
		errs = append(errs, r.cfg.Registrar.UnregisterHost(im.data))
	}
	errs = append(errs, syscall.Munmap(im.data))
	im.data = nil
	r.stats.HostBytes -= im.meta.Size // the flat file's; its chunks are counted now
	r.stats.LogicalBytes -= im.meta.Size
	errs = append(errs, os.Remove(flat))
	if err := errors.Join(errs...); err != nil {
		r.unrefChunksLocked(im)
		return fmt.Errorf("repository: function %s: %w", im.meta.Function, err)
	}
	if err := r.mapChunks(im); err != nil {
		r.unrefChunksLocked(im)
		return err
	}
	r.stats.LogicalBytes += im.meta.Size
	r.hostGa.Set(float64(r.stats.HostBytes))
	return nil
}

func (r *Repository) writeMeta(m meta) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	tmp := r.metaPath(m.Function) + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	if err := os.Rename(tmp, r.metaPath(m.Function)); err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	return nil
}

// Get holds function's image (loading it back from disk if it was spilled) until Release.
func (r *Repository) Get(ctx context.Context, function string) (*Image, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	im, ok := r.images[function]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, function)
	}
	if im.data == nil {
		if err := r.loadLocked(ctx, im); err != nil {
			return nil, err
		}
	}
	im.holders++
	im.lastUsed = r.cfg.Now()
	return im, nil
}

// Release ends a hold from Get or Create. An uncommitted image is discarded on release.
func (im *Image) Release() error {
	r := im.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if im.holders == 0 {
		return fmt.Errorf("%w: function %s: released more often than held", ErrInvalid, im.meta.Function)
	}
	im.holders--
	if !im.commited && im.holders == 0 {
		delete(r.pending, im)
		err := r.unmapImage(im)
		r.hostGa.Set(float64(r.stats.HostBytes))
		return errors.Join(err, os.Remove(r.shmPath(im.meta.Function)+".new"))
	}
	return nil
}

// Has reports whether function has a committed image.
func (r *Repository) Has(function string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.images[function]
	return ok
}

// Functions lists the functions with a committed image.
func (r *Repository) Functions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.images))
	for f := range r.images {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// Delete removes function's image from memory and disk; it fails while the image is held.
func (r *Repository) Delete(function string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	im, ok := r.images[function]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, function)
	}
	if im.holders > 0 {
		return fmt.Errorf("%w: function %s: image in use", ErrInvalid, function)
	}
	return r.dropLocked(im)
}

func (r *Repository) dropLocked(im *Image) error {
	err := r.unmapImage(im)
	r.unrefChunksLocked(im)
	if im.meta.Spilled {
		r.stats.SpilledBytes -= im.meta.Size
	}
	for _, p := range []string{r.shmPath(im.meta.Function), r.metaPath(im.meta.Function)} {
		if e := os.Remove(p); e != nil && !errors.Is(e, os.ErrNotExist) {
			err = errors.Join(err, e)
		}
	}
	if r.cfg.SpillDir != "" {
		_ = os.Remove(r.spillPath(im.meta.Function))
	}
	delete(r.images, im.meta.Function)
	r.hostGa.Set(float64(r.stats.HostBytes))
	return err
}

// Stats returns the repository's counters.
func (r *Repository) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Images = len(r.images)
	return s
}

// makeRoomLocked spills least recently used, unheld images until need more bytes fit the budget.
func (r *Repository) makeRoomLocked(ctx context.Context, need uint64, except string) error {
	if r.cfg.BudgetBytes == 0 {
		return nil
	}
	if need > r.cfg.BudgetBytes {
		return fmt.Errorf("%w: image of %d bytes, budget %d", ErrBudget, need, r.cfg.BudgetBytes)
	}
	for r.stats.HostBytes+need > r.cfg.BudgetBytes {
		if err := ctx.Err(); err != nil {
			return err
		}
		var victim *Image
		for _, im := range r.images {
			if im.data == nil || im.holders > 0 || im.meta.Function == except {
				continue
			}
			if victim == nil || im.lastUsed.Before(victim.lastUsed) {
				victim = im
			}
		}
		if victim == nil {
			return fmt.Errorf("%w: %d bytes needed, %d of %d in images that are in use", ErrBudget, need,
				r.stats.HostBytes, r.cfg.BudgetBytes)
		}
		if err := r.spillLocked(victim); err != nil {
			return err
		}
	}
	return nil
}

func (r *Repository) spillLocked(im *Image) error {
	if err := copyFile(r.spillPath(im.meta.Function), im.data); err != nil {
		return fmt.Errorf("repository: spill %s: %w", im.meta.Function, err)
	}
	m := im.meta
	m.Spilled = true
	m.Segments = append([]Segment(nil), m.Segments...)
	for i := range m.Segments {
		m.Segments[i].Chunks = nil // spilled flat; chunked again when loaded
	}
	if err := r.writeMeta(m); err != nil {
		return err
	}
	chunked := im.meta.chunked()
	im.meta.Spilled = true
	if err := r.unmapImage(im); err != nil {
		return err
	}
	if chunked {
		r.unrefChunksLocked(im)
	} else if err := os.Remove(r.shmPath(im.meta.Function)); err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	r.stats.Spills++
	r.stats.SpilledBytes += im.meta.Size
	r.spills.Inc()
	r.hostGa.Set(float64(r.stats.HostBytes))
	return nil
}

func (r *Repository) loadLocked(ctx context.Context, im *Image) error {
	if err := r.makeRoomLocked(ctx, im.meta.Size, im.meta.Function); err != nil {
		return err
	}
	src, err := os.Open(r.spillPath(im.meta.Function))
	if err != nil {
		return fmt.Errorf("repository: load %s: %w", im.meta.Function, err)
	}
	defer src.Close()
	tmp := r.shmPath(im.meta.Function) + ".load"
	dst, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	_, err = io.Copy(dst, src)
	err = errors.Join(err, dst.Close())
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("repository: load %s: %w", im.meta.Function, err)
	}
	if err := r.mapImage(im, tmp); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := r.chunkLocked(im, tmp); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	m := im.meta
	m.Spilled = false
	if err := r.writeMeta(m); err != nil {
		return err
	}
	im.meta.Spilled = false
	r.stats.SpilledBytes -= im.meta.Size
	r.stats.Loads++
	_ = os.Remove(r.spillPath(im.meta.Function))
	r.hostGa.Set(float64(r.stats.HostBytes))
	return nil
}

func copyFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Close unmaps every image; the files stay for the next Open.
func (r *Repository) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, im := range r.images {
		errs = append(errs, r.unmapImage(im))
	}
	for im := range r.pending {
		errs = append(errs, r.unmapImage(im), os.Remove(r.shmPath(im.meta.Function)+".new"))
		delete(r.pending, im)
	}
	if r.cfg.Registerer != nil {
		r.cfg.Registerer.Unregister(r.spills)
		r.cfg.Registerer.Unregister(r.hostGa)
	}
	return errors.Join(errs...)
}

// HostImages returns the bytes each committed image in dir holds in host memory (a spilled one holds none), read
// from the sidecar files, so that another process (the gpuserver's metering, beside executor processes that own
// the repository) can see them. An unreadable sidecar is skipped.
func HostImages(dir string) (map[string]uint64, error) {
	metas, err := filepath.Glob(filepath.Join(dir, "*.meta.json"))
	if err != nil {
		return nil, fmt.Errorf("repository: %w", err)
	}
	out := make(map[string]uint64, len(metas))
	for _, mp := range metas {
		raw, err := os.ReadFile(mp)
		if err != nil {
			continue // removed meanwhile
		}
		var m meta
		if json.Unmarshal(raw, &m) != nil || m.Function == "" || m.Spilled {
			continue
		}
		out[m.Function] = m.Size
	}
	return out, nil
}
