package tenant

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// lending is the chunks hand-off, gpuserver side: every GPU's chunks stay in the gpuserver's pools (created at
// start); an executor borrows them by descriptor and gives them back. A chunk lent to another executor than the
// one that held it last (another tenant, or the same tenant's restarted executor) is zeroed first, in the
// gpuserver's own context: nothing one tenant left in physical memory reaches another.
type lending struct {
	dev    device.Backend
	sharer device.Sharer
	mem    *memory.Manager

	mu     sync.Mutex
	holder []map[int]*generation // per GPU: chunk index -> the executor holding it
	last   []map[int]*generation // per GPU: chunk index -> the executor that held it last
	phys   []map[int]device.Physical

	zero []*zeroer // per GPU
}

// zeroer clears chunks on one GPU: mapped at a staging range of the gpuserver's, memset, synchronised, unmapped.
type zeroer struct {
	mu      sync.Mutex
	gpu     int
	staging device.Ptr
	stream  device.Stream
}

func newLending(dev device.Backend, mem *memory.Manager) (*lending, error) {
	sharer, ok := dev.(device.Sharer)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend cannot lend chunks to another process", device.ErrNotSupported,
			dev.Kind())
	}
	l := &lending{dev: dev, sharer: sharer, mem: mem}
	for g := range mem.GPUs() {
		l.holder = append(l.holder, map[int]*generation{})
		l.last = append(l.last, map[int]*generation{})
		l.phys = append(l.phys, map[int]device.Physical{})
		l.zero = append(l.zero, &zeroer{gpu: g})
	}
	return l, nil
}

// borrow lends n chunks of gpu to g; when the pool runs short it asks the other executors for free chunks, then for
// idle copies (reclaim). The descriptors are the caller's to send and close.
func (l *lending) borrow(ctx context.Context, g *generation, gpu, n int, others func() []*generation) (handoff.Lent, []*os.File, error) {
	if gpu < 0 || gpu >= len(l.holder) || n <= 0 || n > handoff.MaxBorrow {
		return handoff.Lent{}, nil, fmt.Errorf("%w: borrow %d chunks of gpu %d", handoff.ErrProtocol, n, gpu)
	}
	pool := l.mem.Pool(gpu)
	chunks, err := pool.Get(n)
	for pass := 0; err != nil && errors.Is(err, memory.ErrNoSpace) && pass < 2; pass++ {
		for _, o := range others() {
			if o == g {
				continue
			}
			if short := n - pool.Free(); short > 0 {
				l.reclaimFrom(ctx, o, gpu, short, pass == 1)
			}
		}
		chunks, err = pool.Get(n)
	}
	if err != nil {
		return handoff.Lent{}, nil, err
	}
	var dirty []memory.Chunk
	l.mu.Lock()
	for _, c := range chunks {
		if l.last[gpu][c.Index] != g {
			dirty = append(dirty, c)
		}
	}
	l.mu.Unlock()
	if err := l.zero[gpu].clear(l, dirty); err != nil {
		_ = pool.Put(chunks)
		return handoff.Lent{}, nil, fmt.Errorf("zero chunks before lending them: %w", err)
	}
	files := make([]*os.File, 0, len(chunks))
	idx := make([]int, 0, len(chunks))
	for _, c := range chunks {
		f, err := l.sharer.ExportPhysical(c.Phys)
		if err != nil {
			for _, f := range files {
				_ = f.Close()
			}
			_ = pool.Put(chunks)
			return handoff.Lent{}, nil, fmt.Errorf("export chunk %d of gpu %d: %w", c.Index, gpu, err)
		}
		files = append(files, f)
		idx = append(idx, c.Index)
	}
	l.mu.Lock()
	for _, c := range chunks {
		l.holder[gpu][c.Index] = g
		l.phys[gpu][c.Index] = c.Phys
	}
	l.mu.Unlock()
	return handoff.Lent{GPU: gpu, Indexes: idx, Size: l.mem.ChunkSize()}, files, nil
}

// giveBack takes chunks back from g.
func (l *lending) giveBack(g *generation, gpu int, idx []int) error {
	if gpu < 0 || gpu >= len(l.holder) {
		return fmt.Errorf("%w: return chunks of gpu %d", handoff.ErrProtocol, gpu)
	}
	l.mu.Lock()
	var chunks []memory.Chunk
	for _, i := range idx {
		if l.holder[gpu][i] != g {
			l.mu.Unlock()
			return fmt.Errorf("%w: chunk %d of gpu %d is not lent to this executor", handoff.ErrProtocol, i, gpu)
		}
	}
	for _, i := range idx {
		delete(l.holder[gpu], i)
		l.last[gpu][i] = g
		chunks = append(chunks, memory.Chunk{Index: i, Phys: l.phys[gpu][i]})
	}
	l.mu.Unlock()
	return l.mem.Pool(gpu).Put(chunks)
}

// takeAll takes back every chunk g held (its process ended: its mappings went with it).
func (l *lending) takeAll(g *generation) {
	for gpu := range l.holder {
		var idx []int
		l.mu.Lock()
		for i, h := range l.holder[gpu] {
			if h == g {
				idx = append(idx, i)
			}
		}
		l.mu.Unlock()
		if len(idx) > 0 {
			_ = l.giveBack(g, gpu, idx)
		}
	}
}

// lent counts the chunks lent per GPU.
func (l *lending) lent() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]int, len(l.holder))
	for g, m := range l.holder {
		out[g] = len(m)
	}
	return out
}

// reclaimFrom asks o for up to n free chunks of gpu (with evict, also idle copies); what it gives back returns to
// the pool.
func (l *lending) reclaimFrom(ctx context.Context, o *generation, gpu, n int, evict bool) {
	peer := o.live()
	if peer == nil {
		return
	}
	got, err := handoff.OpReclaim.Call(ctx, peer, handoff.Reclaim{GPU: gpu, N: n, Evict: evict})
	if err != nil {
		return
	}
	if len(got.Indexes) > 0 && got.GPU == gpu {
		_ = l.giveBack(o, gpu, got.Indexes)
	}
}

// clear zeroes chunks of z's GPU, at most handoff.MaxBorrow at a time.
func (z *zeroer) clear(l *lending, chunks []memory.Chunk) error {
	if len(chunks) == 0 {
		return nil
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	cs := l.mem.ChunkSize()
	if z.stream == nil {
		p, err := l.dev.ReserveAddress(uint64(handoff.MaxBorrow)*cs, 0)
		if err != nil {
			return err
		}
		s, err := l.dev.NewStream(z.gpu)
		if err != nil {
			_ = l.dev.FreeAddress(p, uint64(handoff.MaxBorrow)*cs)
			return err
		}
		z.staging, z.stream = p, s
	}
	for len(chunks) > 0 {
		k := min(len(chunks), handoff.MaxBorrow)
		if err := l.mem.MapAt(z.staging, chunks[:k], []int{z.gpu}); err != nil {
			return err
		}
		err := z.stream.Memset8(z.staging, 0, uint64(k)*cs)
		if err == nil {
			err = z.stream.Synchronize(context.Background())
		}
		if uerr := l.mem.Unmap(z.staging, uint64(k)*cs); err == nil {
			err = uerr
		}
		if err != nil {
			return err
		}
		chunks = chunks[k:]
	}
	return nil
}

// close releases the zeroers' staging ranges and streams.
func (l *lending) close() error {
	var errs []error
	for _, z := range l.zero {
		z.mu.Lock()
		if z.stream != nil {
			errs = append(errs, z.stream.Destroy(),
				l.dev.FreeAddress(z.staging, uint64(handoff.MaxBorrow)*l.mem.ChunkSize()))
			z.stream = nil
		}
		z.mu.Unlock()
	}
	return errors.Join(errs...)
}
