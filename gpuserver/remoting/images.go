package remoting

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
)

// Bounds of the module images the server holds when its Config names none. A PyTorch process through the shim
// loads about 40 MB of images (CUDA 13, PyTorch 2.11: ResNet-152 and BERT-base forward passes, 8.4 MB the largest
// one), so a function's bound leaves room for several such libraries; the node's bound for a few dozen functions'.
const (
	DefaultMaxModuleBytesPerFunction = 1 << 30
	DefaultMaxModuleBytes            = 4 << 30
)

// errImageLimit: a module image (or the chunks of one being received) would exceed a function's or the node's
// bound on module image bytes.
var errImageLimit = errors.New("module image bytes limit")

// moduleImages holds the module images of every session of the node, one copy per distinct content (SHA-256): the
// sessions of a function, and functions that load the same libraries, share it. It bounds what functions send:
// per function, the distinct images its sessions hold plus the chunks they are receiving (an image too large for
// one record); per node, every distinct image plus every chunk being received. It is safe for concurrent use.
type moduleImages struct {
	maxPerFunction, maxTotal uint64
	node                     NodeImageBudget // the node's bound over several processes (Config.NodeImages), or nil

	mu     sync.Mutex
	images map[[32]byte]*sharedImage
	total  uint64 // bytes of images and chunks being received, node-wide
	fns    map[string]*functionImages
}

type sharedImage struct {
	bytes []byte
	refs  int // modules holding it, over every function
}

type functionImages struct {
	bytes uint64           // charged to the function: its distinct images and the chunks it is receiving
	refs  map[[32]byte]int // modules of the function holding each image
}

func newModuleImages(maxPerFunction, maxTotal uint64) *moduleImages {
	return &moduleImages{maxPerFunction: maxPerFunction, maxTotal: maxTotal, images: map[[32]byte]*sharedImage{},
		fns: map[string]*functionImages{}}
}

func (s *moduleImages) fnLocked(function string) *functionImages {
	f := s.fns[function]
	if f == nil {
		f = &functionImages{refs: map[[32]byte]int{}}
		s.fns[function] = f
	}
	return f
}

func (s *moduleImages) dropFnLocked(function string) {
	if f := s.fns[function]; f != nil && f.bytes == 0 && len(f.refs) == 0 {
		delete(s.fns, function)
	}
}

// NodeImageBudget is the node's bound on module images where the node's sessions run in several processes (an
// executor per tenant): each process reserves the bytes its images (and chunks being received) take before it keeps
// them, and gives them back when it drops them, so that the node's bound (MaxModuleBytes) holds over all of them
// together, not per process.
type NodeImageBudget interface {
	// ReserveImages reserves n bytes, or fails when they do not fit the node's bound.
	ReserveImages(n uint64) error
	// ReleaseImages gives back n bytes reserved before.
	ReleaseImages(n uint64)
}

// uncountLocked gives back n bytes of the node's.
func (s *moduleImages) uncountLocked(n uint64) {
	s.total -= n
	if s.node != nil && n > 0 {
		s.node.ReleaseImages(n)
	}
}

// chargeLocked charges n more bytes to function and, when node, to the node; it fails with errImageLimit
// (charging nothing) when a bound would be exceeded.
func (s *moduleImages) chargeLocked(function string, n uint64, node bool) error {
	f := s.fnLocked(function)
	if f.bytes+n > s.maxPerFunction || f.bytes+n < f.bytes {
		s.dropFnLocked(function)
		return fmt.Errorf("%w: function %s would hold %d bytes of module images, at most %d (MaxModuleBytesPerFunction)",
			errImageLimit, function, f.bytes+n, s.maxPerFunction)
	}
	if node && (s.total+n > s.maxTotal || s.total+n < s.total) {
		s.dropFnLocked(function)
		return fmt.Errorf("%w: the node would hold %d bytes of module images, at most %d (MaxModuleBytes)",
			errImageLimit, s.total+n, s.maxTotal)
	}
	if node && s.node != nil && n > 0 {
		if err := s.node.ReserveImages(n); err != nil {
			s.dropFnLocked(function)
			return fmt.Errorf("%w: %w", errImageLimit, err)
		}
	}
	f.bytes += n
	if node {
		s.total += n
	}
	return nil
}

// reserve charges n bytes of chunks of an image being received by a session of function.
func (s *moduleImages) reserve(function string, n uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chargeLocked(function, n, true)
}

// unreserve gives back n bytes of chunks reserved for function.
func (s *moduleImages) unreserve(function string, n uint64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fns[function].bytes -= n
	s.uncountLocked(n)
	s.dropFnLocked(function)
}

// imageRef is a module's hold on a stored image.
type imageRef struct {
	sum   [32]byte
	bytes []byte // shared: never written
}

// hold stores image for a module of function, or finds the copy another module holds, and returns the module's
// hold on it; reserved is what the session had reserved for the image's chunks (given back here). copyIn says
// that image is not the caller's to keep (it lies in the session's ring), so a new copy is made when it is stored.
func (s *moduleImages) hold(function string, image []byte, reserved uint64, copyIn bool) (imageRef, error) {
	sum := sha256.Sum256(image)
	size := uint64(len(image))
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fnLocked(function)
	f.bytes -= reserved
	s.uncountLocked(reserved)
	si := s.images[sum]
	if f.refs[sum] == 0 {
		if err := s.chargeLocked(function, size, si == nil); err != nil {
			s.dropFnLocked(function)
			return imageRef{}, err
		}
	} else if si == nil {
		panic("remoting: a function holds an image the node does not")
	}
	if si == nil {
		if copyIn {
			image = append([]byte(nil), image...)
		}
		si = &sharedImage{bytes: image}
		s.images[sum] = si
	}
	si.refs++
	f.refs[sum]++
	return imageRef{sum: sum, bytes: si.bytes}, nil
}

// release ends a module's hold on its image; the image is dropped when no module holds it.
func (s *moduleImages) release(function string, ref imageRef) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, si := s.fns[function], s.images[ref.sum]
	if f == nil || si == nil || f.refs[ref.sum] == 0 {
		return
	}
	size := uint64(len(si.bytes))
	if f.refs[ref.sum]--; f.refs[ref.sum] == 0 {
		delete(f.refs, ref.sum)
		f.bytes -= size
	}
	if si.refs--; si.refs == 0 {
		delete(s.images, ref.sum)
		s.uncountLocked(size)
	}
	s.dropFnLocked(function)
}

// usage returns the bytes charged to function and to the node.
func (s *moduleImages) usage(function string) (fn, node uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.fns[function]; f != nil {
		fn = f.bytes
	}
	return fn, s.total
}
