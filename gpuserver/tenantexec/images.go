package tenantexec

import (
	"context"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// imageBudget reserves the bytes of the executor's module images with the gpuserver (handoff.OpReserveImages),
// whose bound is the node's over every executor.
type imageBudget struct{ p *process }

var _ remoting.NodeImageBudget = imageBudget{}

// reserveTimeout bounds a reservation (the gpuserver answers it at once).
const reserveTimeout = 10 * time.Second

func (b imageBudget) ReserveImages(n uint64) error {
	ctx, cancel := context.WithTimeout(b.p.ctx, reserveTimeout)
	defer cancel()
	_, err := handoff.OpReserveImages.Call(ctx, b.p.peer, handoff.ImageBytes{Bytes: n})
	return err
}

// ReleaseImages waits for the gpuserver's answer, so that a reservation made after it never reaches the gpuserver
// first (and is refused for bytes already given back). An ended gpuserver took everything back.
func (b imageBudget) ReleaseImages(n uint64) {
	ctx, cancel := context.WithTimeout(b.p.ctx, reserveTimeout)
	defer cancel()
	_, _ = handoff.OpReleaseImages.Call(ctx, b.p.peer, handoff.ImageBytes{Bytes: n})
}
