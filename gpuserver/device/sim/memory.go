package sim

import (
	"fmt"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// physical is simulated physical memory: host pages of the granularity, allocated on first touch; or, once
// shared with another process (share.go), one memfd mapping of the whole allocation.
type physical struct {
	b        *Backend
	gpu      int
	size     uint64
	mu       sync.Mutex
	pages    [][]byte
	maps     int // live mappings; guarded by b.mu
	released bool
	shared   sharedPages // set once exported or imported (share.go)
}

func (p *physical) GPU() int     { return p.gpu }
func (p *physical) Size() uint64 { return p.size }

// Release frees the memory; it must not be mapped.
func (p *physical) Release() error {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if p.released {
		return fmt.Errorf("%w: physical memory released twice", device.ErrInvalidValue)
	}
	if p.maps > 0 {
		return fmt.Errorf("%w: physical memory still mapped", device.ErrInvalidValue)
	}
	p.released = true
	if !p.shared.imported {
		p.b.used[p.gpu] -= p.size
	}
	p.mu.Lock()
	p.pages = nil
	err := p.shared.release()
	p.mu.Unlock()
	return err
}

func (p *physical) page(i uint64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shared.mem != nil {
		return p.shared.mem[i*p.b.gran : (i+1)*p.b.gran]
	}
	if p.pages[i] == nil {
		p.pages[i] = make([]byte, p.b.gran)
	}
	return p.pages[i]
}

// segment is a piece of a device range inside one page.
type segment struct {
	buf  []byte
	gpu  int       // GPU owning the memory
	phys *physical // the physical memory behind buf (nil for registered host memory)
	idx  uint64    // buf's granule in phys
}

// prepareWrite backs the shared granules that segs overwrite whole before they are written (sharedPages.back):
// one call per granule instead of a page fault per page. Partial writes fault their pages in as they come.
func (b *Backend) prepareWrite(segs []segment) {
	for _, s := range segs {
		if s.phys == nil || uint64(len(s.buf)) != b.gran {
			continue
		}
		s.phys.mu.Lock()
		if s.phys.shared.mem != nil {
			s.phys.shared.back(s.idx, b.gran)
		}
		s.phys.mu.Unlock()
	}
}

// Who touches memory: work of a GPU in one of its contexts. The memory functions below take it as an int (the
// reference kernels pass it through unchanged as their "gpu"): the GPU in the low 8 bits (the sim models at most
// 64 GPUs), the context id above them, 0 for the backend's own context of the GPU. Access to mapped memory is
// granted per GPU (SetAccess), as the driver's virtual memory management does; a context's own memory (module
// globals) is reachable from that context only.
func who(gpu int, ctx uint64) int { return gpu | int(ctx)<<8 }

func whoGPU(w int) int    { return w & 0xff }
func whoCtx(w int) uint64 { return uint64(w) >> 8 }
func whoString(w int) string {
	if c := whoCtx(w); c != 0 {
		return fmt.Sprintf("gpu %d (context %d)", whoGPU(w), c)
	}
	return fmt.Sprintf("gpu %d", whoGPU(w))
}

// resolve returns the host memory behind [ptr, ptr+n) as seen by w (see who), checking mappings and access.
func (b *Backend) resolve(w int, ptr device.Ptr, n uint64) ([]segment, error) {
	if n == 0 {
		return nil, nil
	}
	if uint64(ptr)+n < uint64(ptr) {
		return nil, fmt.Errorf("%w: range overflows", device.ErrIllegalAddress)
	}
	gpu := whoGPU(w)
	var out []segment
	b.mu.RLock()
	defer b.mu.RUnlock()
	for addr, end := uint64(ptr), uint64(ptr)+n; addr < end; {
		pg := addr / b.gran
		m, ok := b.pages[pg]
		if !ok {
			if host, ok := b.hostMemoryLocked(addr, end); ok { // registered host memory (ProcessWide)
				out = append(out, segment{buf: host, gpu: gpu})
				addr += uint64(len(host))
				continue
			}
			return nil, fmt.Errorf("%w: %s touched %#x, which is not mapped", device.ErrIllegalAddress, whoString(w),
				addr)
		}
		if m.access&(1<<gpu) == 0 {
			return nil, fmt.Errorf("%w: %s touched %#x without access (access: %v)", device.ErrIllegalAddress,
				whoString(w), addr, sortedGPUs(m.access))
		}
		if m.ctx != 0 && m.ctx != whoCtx(w) && !b.opts.ProcessWide {
			return nil, fmt.Errorf("%w: %s touched %#x, memory of context %d", device.ErrIllegalAddress,
				whoString(w), addr, m.ctx)
		}
		off := addr - uint64(m.start) + m.offset
		page := m.phys.page(off / b.gran)
		in := off % b.gran
		take := min(end-addr, b.gran-in)
		out = append(out, segment{buf: page[in : in+take], gpu: m.phys.gpu, phys: m.phys, idx: off / b.gran})
		addr += take
	}
	return out, nil
}

// writable checks that no page of [ptr, ptr+n) is mapped read-only (the caller resolved the range).
func (b *Backend) writable(w int, ptr device.Ptr, n uint64) error {
	if n == 0 {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for pg := uint64(ptr) / b.gran; pg <= (uint64(ptr)+n-1)/b.gran; pg++ {
		if m, ok := b.pages[pg]; ok && m.readOnly {
			return fmt.Errorf("%w: %s wrote %#x, which is mapped read-only", device.ErrIllegalAddress, whoString(w),
				pg*b.gran)
		}
	}
	return nil
}

// zeroDevice sets [ptr, ptr+n) to zero as seen by w. Whole pages are dropped instead of written (a page not
// yet touched reads as zero), so zeroing memory costs neither time nor host memory.
func (b *Backend) zeroDevice(w int, ptr device.Ptr, n uint64) error {
	b.mu.RLock()
	host, ok := b.hostMemoryLocked(uint64(ptr), uint64(ptr)+n)
	b.mu.RUnlock()
	if ok && uint64(len(host)) == n { // registered host memory (ProcessWide)
		clear(host)
		return nil
	}
	if err := b.resolveChecked(w, ptr, n); err != nil {
		return err
	}
	if err := b.writable(w, ptr, n); err != nil {
		return err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for addr, end := uint64(ptr), uint64(ptr)+n; addr < end; {
		m := b.pages[addr/b.gran]
		off := addr - uint64(m.start) + m.offset
		idx, in := off/b.gran, off%b.gran
		take := min(end-addr, b.gran-in)
		m.phys.mu.Lock()
		switch {
		case m.phys.shared.mem != nil:
			m.phys.shared.zero(idx*b.gran+in, take, b.gran)
		case m.phys.pages == nil:
		case in == 0 && take == b.gran:
			m.phys.pages[idx] = nil
		case m.phys.pages[idx] != nil:
			clear(m.phys.pages[idx][in : in+take])
		}
		m.phys.mu.Unlock()
		addr += take
	}
	return nil
}

// resolveChecked checks that w may touch [ptr, ptr+n) without touching (allocating) any page.
func (b *Backend) resolveChecked(w int, ptr device.Ptr, n uint64) error {
	if n == 0 {
		return nil
	}
	if uint64(ptr)+n < uint64(ptr) {
		return fmt.Errorf("%w: range overflows", device.ErrIllegalAddress)
	}
	gpu := whoGPU(w)
	b.mu.RLock()
	defer b.mu.RUnlock()
	if host, ok := b.hostMemoryLocked(uint64(ptr), uint64(ptr)+n); ok && uint64(len(host)) == n {
		return nil // registered host memory (ProcessWide)
	}
	for pg := uint64(ptr) / b.gran; pg <= (uint64(ptr)+n-1)/b.gran; pg++ {
		m, ok := b.pages[pg]
		switch {
		case !ok:
			return fmt.Errorf("%w: %s touched %#x, which is not mapped", device.ErrIllegalAddress,
				whoString(w), pg*b.gran)
		case m.access&(1<<gpu) == 0:
			return fmt.Errorf("%w: %s touched %#x without access (access: %v)", device.ErrIllegalAddress,
				whoString(w), pg*b.gran, sortedGPUs(m.access))
		case m.ctx != 0 && m.ctx != whoCtx(w) && !b.opts.ProcessWide:
			return fmt.Errorf("%w: %s touched %#x, memory of context %d", device.ErrIllegalAddress,
				whoString(w), pg*b.gran, m.ctx)
		}
	}
	return nil
}

// readDevice copies [ptr, ptr+len(dst)) into dst.
func (b *Backend) readDevice(gpu int, dst []byte, ptr device.Ptr) error {
	segs, err := b.resolve(gpu, ptr, uint64(len(dst)))
	if err != nil {
		return err
	}
	for _, s := range segs {
		dst = dst[copy(dst, s.buf):]
	}
	return nil
}

// writeDevice copies src to [ptr, ptr+len(src)).
func (b *Backend) writeDevice(gpu int, ptr device.Ptr, src []byte) error {
	segs, err := b.resolve(gpu, ptr, uint64(len(src)))
	if err != nil {
		return err
	}
	if err := b.writable(gpu, ptr, uint64(len(src))); err != nil {
		return err
	}
	b.prepareWrite(segs)
	for _, s := range segs {
		src = src[copy(s.buf, src):]
	}
	return nil
}

// ownerGPU is the GPU whose memory backs ptr (for the link a copy uses), or -1.
func (b *Backend) ownerGPU(ptr device.Ptr) int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if m, ok := b.pages[uint64(ptr)/b.gran]; ok {
		return m.phys.gpu
	}
	return -1
}

// copyDevice copies size bytes from src to dst as seen from GPU gpu, without an intermediate buffer.
func (b *Backend) copyDevice(gpu int, dst, src device.Ptr, size uint64) error {
	from, err := b.resolve(gpu, src, size)
	if err != nil {
		return err
	}
	to, err := b.resolve(gpu, dst, size)
	if err != nil {
		return err
	}
	if err := b.writable(gpu, dst, size); err != nil {
		return err
	}
	b.prepareWrite(to)
	for len(from) > 0 && len(to) > 0 {
		n := copy(to[0].buf, from[0].buf)
		from[0].buf, to[0].buf = from[0].buf[n:], to[0].buf[n:]
		if len(from[0].buf) == 0 {
			from = from[1:]
		}
		if len(to[0].buf) == 0 {
			to = to[1:]
		}
	}
	return nil
}
