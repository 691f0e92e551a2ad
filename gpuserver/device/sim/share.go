package sim

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Physical memory shared between processes (device.Sharer), as the gpuserver lends chunks to tenant executor
// processes (docs/tenants.md): an exported allocation moves its bytes into a memfd (sealed against shrinking and
// growing, so that no holder can make another's mapping fault) and is mapped from it from then on; an importing
// process maps the memfd it was sent. Both see the same bytes, as two processes mapping one CUDA allocation do.

var _ device.Sharer = (*Backend)(nil)

// sharedPages is an allocation's bytes in a memfd mapped into this process.
type sharedPages struct {
	mem      []byte
	file     *os.File // the memfd (to export again, or to back granules); nil once released
	imported bool     // mapped from another process's allocation: not counted in this backend's memory
	backed   []bool   // per granule: allocated and mapped writable in one go (back), until zero gives it back
}

// back allocates granule i's pages in the memfd and maps them writable, in two calls, before a write of the
// whole granule: a memfd page touched for the first time otherwise costs a page fault each (shmem allocation
// and accounting per 4 KiB page; a fresh 256 MiB model is 65536 of them), a private page is cheaper to fault in
// and the Go heap often reuses pages it has, so the swap onto chunks lent by descriptor would trail the same
// swap in one process by far more than the copy. Only a granule about to be written whole is backed: a lent chunk
// costs host memory for what is written into it, as before. Failures leave the pages to fault in as they come.
func (s *sharedPages) back(i, gran uint64) {
	if s.file == nil {
		return
	}
	if s.backed == nil {
		s.backed = make([]bool, uint64(len(s.mem))/gran)
	}
	if s.backed[i] {
		return
	}
	off := i * gran
	if unix.Fallocate(int(s.file.Fd()), 0, int64(off), int64(gran)) != nil {
		return
	}
	s.backed[i] = unix.Madvise(s.mem[off:off+gran], unix.MADV_POPULATE_WRITE) == nil
}

func (s *sharedPages) release() error {
	var errs []error
	if s.mem != nil {
		errs = append(errs, unix.Munmap(s.mem))
	}
	if s.file != nil {
		errs = append(errs, s.file.Close())
	}
	*s = sharedPages{imported: s.imported}
	return errors.Join(errs...)
}

// zero sets n bytes at off to zero: whole granules are given back to the kernel (they read as zero and cost no
// memory, as the private pages' zeroing drops them), the rest is cleared.
func (s *sharedPages) zero(off, n, gran uint64) {
	if off%gran == 0 && n%gran == 0 && unix.Madvise(s.mem[off:off+n], unix.MADV_REMOVE) == nil {
		for i := off / gran; i < (off+n)/gran && s.backed != nil; i++ {
			s.backed[i] = false
		}
		return
	}
	clear(s.mem[off : off+n])
}

// ExportPhysical returns a new descriptor of the memfd holding phys's bytes (created at the first export; phys
// must not be mapped then).
func (b *Backend) ExportPhysical(phys device.Physical) (*os.File, error) {
	p, ok := phys.(*physical)
	if !ok || p.b != b {
		return nil, fmt.Errorf("%w: physical memory of another backend", device.ErrInvalidValue)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.released:
		return nil, fmt.Errorf("%w: physical memory released", device.ErrInvalidValue)
	case p.shared.imported:
		return nil, fmt.Errorf("%w: physical memory imported from another process cannot be exported again",
			device.ErrNotSupported)
	}
	if p.shared.file == nil {
		if p.maps > 0 {
			return nil, fmt.Errorf("%w: physical memory is mapped: export it before mapping it", device.ErrInvalidValue)
		}
		f, mem, err := newMemfd(p.size)
		if err != nil {
			return nil, err
		}
		for i, pg := range p.pages {
			if pg != nil {
				copy(mem[uint64(i)*b.gran:], pg)
			}
		}
		p.shared, p.pages = sharedPages{mem: mem, file: f}, nil
	}
	fd, err := unix.FcntlInt(p.shared.file.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sim: export: %w", err)
	}
	return os.NewFile(uintptr(fd), "sim-physical"), nil
}

// ImportPhysical maps a memfd another process exported as physical memory of GPU gpu. The memfd must be exactly
// size bytes and sealed against shrinking.
func (b *Backend) ImportPhysical(gpu int, size uint64, f *os.File) (device.Physical, error) {
	if err := b.validGPU(gpu); err != nil {
		return nil, err
	}
	if size == 0 || size%b.gran != 0 {
		return nil, fmt.Errorf("%w: physical size %d is not a multiple of %d", device.ErrInvalidValue, size, b.gran)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("sim: import: %w", err)
	}
	if uint64(st.Size) != size {
		return nil, fmt.Errorf("%w: import: the descriptor holds %d bytes, want %d", device.ErrInvalidValue, st.Size,
			size)
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("%w: import: the descriptor is not a memfd sealed against shrinking (%v)",
			device.ErrInvalidValue, err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("sim: import: mmap: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("sim: %w: closed", device.ErrUnavailable)
	}
	// A duplicate of the descriptor stays open with the mapping (the caller closes f), for sharedPages.back to
	// allocate through; where none is left (the open-files limit), the pages fault in as they are written.
	shared := sharedPages{mem: mem, imported: true}
	if fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0); err == nil {
		shared.file = os.NewFile(uintptr(fd), "sim-physical-import")
	}
	return &physical{b: b, gpu: gpu, size: size, shared: shared}, nil
}

// newMemfd creates a sealed memfd of size bytes and maps it.
func newMemfd(size uint64) (*os.File, []byte, error) {
	fd, err := unix.MemfdCreate("faas-gpu-sim-physical", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, fmt.Errorf("sim: memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "sim-physical")
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sim: memfd: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sim: memfd seals: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sim: memfd mmap: %w", err)
	}
	return f, mem, nil
}
