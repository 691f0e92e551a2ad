package sim

import (
	"fmt"
	"unsafe"
)

// What one process shares on a real GPU (Options.ProcessWide), as the GPU suite measured it on an H100
// (docs/security.md, "Measured on a real GPU"): the driver maps page-locked host memory for every context of the
// process (unified addressing), module globals are reachable from every context, and an illegal address poisons
// every context of the process, its primary contexts included, until the process ends. So contexts of one process
// isolate nothing; processes do (docs/tenants.md). The sim models this so that the attacks that succeed inside one
// process are shown to fail across tenant executor processes, without a GPU.

// hostMemoryLocked returns the registered host memory at [addr, end) up to the end of its registration, when the
// backend models process-wide sharing and addr lies in a registered buffer (RegisterHost). b.mu is held.
func (b *Backend) hostMemoryLocked(addr, end uint64) ([]byte, bool) {
	if !b.opts.ProcessWide {
		return nil, false
	}
	for start, n := range b.hostRegs {
		s := uint64(uintptr(unsafe.Pointer(start)))
		if addr >= s && addr < s+uint64(n) {
			buf := unsafe.Slice(start, n)
			return buf[addr-s : min(end, s+uint64(n))-s], true
		}
	}
	return nil, false
}

// poisonProcess records a context fault as the process's (ProcessWide): every context of the backend and its own
// streams fail with it from now on.
func (b *Backend) poisonProcess(err error) {
	if !b.opts.ProcessWide {
		return
	}
	e := fmt.Errorf("the process's contexts were poisoned by a fault of one of them: %w", err)
	b.poisoned.CompareAndSwap(nil, &e)
}

// processFault returns the fault that poisoned the process, nil while there is none (always without ProcessWide).
func (b *Backend) processFault() error {
	if p := b.poisoned.Load(); p != nil {
		return *p
	}
	return nil
}

// ctxErr is the sticky fault a stream's work fails with: its context's, or the process's.
func (s *stream) ctxErr() error {
	if s.ctx != nil {
		if err := s.ctx.Err(); err != nil {
			return err
		}
	}
	return s.b.processFault()
}
