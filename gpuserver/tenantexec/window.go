package tenantexec

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// window is the executor's device with every reservation placed inside the tenant's address window (the
// gpuserver's address plan, docs/tenants.md): no address of this tenant is ever mapped in another tenant's
// process, so a kernel that follows another tenant's pointer touches an unmapped address of its own process.
type window struct {
	device.Backend
	log  *slog.Logger
	gran uint64

	mu        sync.Mutex
	next, end uint64
	outside   bool // the driver refused the window: reservations are placed by the driver (logged once)
}

func newWindow(dev device.Backend, base, size uint64, log *slog.Logger) *window {
	var gran uint64
	for _, g := range dev.GPUs() {
		gran = max(gran, g.Granularity)
	}
	return &window{Backend: dev, log: log, gran: gran, next: base, end: base + size}
}

// skip moves the next reservation past [p, p+size) (an image's range from before a restart).
func (w *window) skip(p, size uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p+size+w.gran > w.next && p < w.end {
		w.next = p + size + w.gran
	}
}

// maxTries bounds the ranges tried in the window before giving the reservation to the driver.
const maxTries = 64

// ReserveAddress reserves inside the window, one free granule between reservations (so that an overrun faults).
func (w *window) ReserveAddress(size, alignment uint64) (device.Ptr, error) {
	align := max(alignment, w.gran)
	if size == 0 || align&(align-1) != 0 {
		return 0, fmt.Errorf("%w: reserve %d bytes aligned to %d", device.ErrInvalidValue, size, align)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for try := 0; try < maxTries && !w.outside; try++ {
		p := (w.next + align - 1) &^ (align - 1)
		if p+size > w.end || p+size < p {
			break
		}
		got, err := w.Backend.ReserveAddressAt(device.Ptr(p), size)
		if err == nil {
			w.next = p + size + w.gran
			return got, nil
		}
		if !errors.Is(err, device.ErrOutOfMemory) {
			return 0, err
		}
		w.next = p + size + w.gran // taken: try past it
	}
	if !w.outside {
		w.outside = true
		w.log.Warn("the tenant's address window is full or refused by the driver: further reservations are placed "+
			"by the driver, so another tenant may use the same addresses in its own process", "window_end", w.end)
	}
	return w.Backend.ReserveAddress(size, alignment)
}

// SetAccessReadOnly maps a range read-only where the device can (device.ReadOnlyAccess: chunks shared between the
// tenant's functions, executor/share.go), else read-write as SetAccess does.
func (w *window) SetAccessReadOnly(ptr device.Ptr, size uint64, gpus []int) error {
	if ro, ok := w.Backend.(device.ReadOnlyAccess); ok {
		return ro.SetAccessReadOnly(ptr, size, gpus)
	}
	return w.Backend.SetAccess(ptr, size, gpus)
}
