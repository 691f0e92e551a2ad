package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
)

// GroupPoint is one point of the group-size curve: copying in groups of GroupBytes achieved BytesPerSec.
type GroupPoint struct {
	GroupBytes  uint64  `json:"group_bytes"`
	BytesPerSec float64 `json:"bytes_per_sec"`
}

// ElbowFraction is the share of the best throughput at which the group-size curve's elbow is taken.
const ElbowFraction = 0.9

// ProfileGroupSize measures host-to-device copy throughput on GPU gpu for each group size (copying total bytes in
// groups, from registered host memory into chunks taken from mem), and returns the elbow: the smallest group size
// reaching ElbowFraction of the best throughput. It runs at start, before any function is swapped in.
func ProfileGroupSize(ctx context.Context, dev device.Backend, mem *memory.Manager, gpu int, host []byte,
	sizes []uint64) (uint64, []GroupPoint, error) {
	total := uint64(len(host))
	cs := mem.ChunkSize()
	if total == 0 || total%cs != 0 || len(sizes) == 0 {
		return 0, nil, fmt.Errorf("%w: profile over %d bytes (a multiple of %d) and %d sizes", ErrInvalid, total, cs,
			len(sizes))
	}
	chunks, err := mem.Pool(gpu).Get(int(total / cs))
	if err != nil {
		return 0, nil, fmt.Errorf("profile gpu %d: %w", gpu, err)
	}
	defer mem.Pool(gpu).Put(chunks)
	ptr, err := dev.ReserveAddress(total, 0)
	if err != nil {
		return 0, nil, err
	}
	defer dev.FreeAddress(ptr, total)
	if err := mem.MapAt(ptr, chunks, []int{gpu}); err != nil {
		return 0, nil, err
	}
	defer mem.Unmap(ptr, total)
	s, err := dev.NewStream(gpu)
	if err != nil {
		return 0, nil, err
	}
	defer s.Destroy()
	var curve []GroupPoint
	best := 0.0
	for _, g := range sizes {
		start := time.Now()
		for off := uint64(0); off < total; off += g {
			n := min(g, total-off)
			if err := s.CopyHtoD(ptr+device.Ptr(off), host[off:off+n]); err != nil {
				return 0, nil, err
			}
		}
		if err := s.Synchronize(ctx); err != nil {
			return 0, nil, err
		}
		bw := float64(total) / time.Since(start).Seconds()
		curve = append(curve, GroupPoint{GroupBytes: g, BytesPerSec: bw})
		best = max(best, bw)
	}
	elbow := curve[len(curve)-1].GroupBytes
	for _, p := range curve {
		if p.BytesPerSec >= ElbowFraction*best {
			elbow = p.GroupBytes
			break
		}
	}
	return elbow, curve, nil
}
