package tenantexec

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// lender borrows the executor's chunks from the gpuserver (memory.Lender): each lent chunk comes as a descriptor
// and is imported into the executor's device (cuMemImportFromShareableHandle; the sim maps the memfd).
type lender struct{ p *process }

var _ memory.Lender = lender{}

func (l lender) Borrow(ctx context.Context, gpu, n int) ([]memory.Chunk, error) {
	var out []memory.Chunk
	giveBack := func() {
		if len(out) == 0 {
			return
		}
		idx := make([]int, len(out))
		for i, c := range out {
			_ = c.Phys.Release()
			idx[i] = c.Index
		}
		_ = l.Return(gpu, idx)
	}
	for n > 0 {
		k := min(n, handoff.MaxBorrow)
		lent, files, err := handoff.OpBorrow.CallFiles(ctx, l.p.peer, handoff.Borrow{GPU: gpu, N: k}, nil)
		if err != nil {
			giveBack()
			return nil, err
		}
		chunks, err := l.importAll(gpu, lent, files)
		out = append(out, chunks...)
		if err != nil {
			giveBack()
			return nil, err
		}
		n -= k
	}
	return out, nil
}

// importAll imports the chunks of one Lent reply; on error, the chunks not imported are given back and the
// imported ones returned with the error (the caller gives them back).
func (l lender) importAll(gpu int, lent handoff.Lent, files []*os.File) ([]memory.Chunk, error) {
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	if len(files) != len(lent.Indexes) || lent.GPU != gpu || lent.Size != l.p.cfg.ChunkSize {
		_ = l.Return(gpu, lent.Indexes)
		return nil, fmt.Errorf("%w: lent %d chunks of %d bytes on gpu %d with %d descriptors, asked for gpu %d chunks "+
			"of %d bytes", handoff.ErrProtocol, len(lent.Indexes), lent.Size, lent.GPU, len(files), gpu,
			l.p.cfg.ChunkSize)
	}
	var out []memory.Chunk
	for i, f := range files {
		phys, err := l.p.sharer.ImportPhysical(gpu, lent.Size, f)
		if err != nil {
			_ = l.Return(gpu, lent.Indexes[i:])
			return out, fmt.Errorf("import chunk %d of gpu %d: %w", lent.Indexes[i], gpu, err)
		}
		out = append(out, memory.Chunk{Index: lent.Indexes[i], Phys: phys})
	}
	return out, nil
}

func (l lender) Return(gpu int, indexes []int) error {
	if len(indexes) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(l.p.ctx, returnTimeout)
	defer cancel()
	_, err := handoff.OpReturn.Call(ctx, l.p.peer, handoff.Return{GPU: gpu, Indexes: indexes})
	if errors.Is(err, handoff.ErrClosed) {
		return nil // the gpuserver takes every chunk back when an executor ends
	}
	return err
}
