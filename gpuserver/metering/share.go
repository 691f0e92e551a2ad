package metering

import (
	"errors"
	"fmt"
)

// ErrInvalidShare: a share outside (0, 1].
var ErrInvalidShare = errors.New("metering: share must be in (0, 1]")

// SetShare sets the share of its GPU's compute that binding id is granted from now on (the arbiter's current share
// of a co-runner, gpuserver/compute): its GPU seconds count at that rate until the next SetShare or End; the time
// before is counted at the share it had. A binding Begin started counts at 1 (exclusive). An unknown id is
// ignored, as End ignores it.
func (m *Meter) SetShare(id string, share float64) error {
	if !(share > 0 && share <= 1) {
		return fmt.Errorf("%w: %v for binding %s", ErrInvalidShare, share, id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.open[id]
	if !ok {
		return nil
	}
	m.advanceLocked(m.cfg.Now())
	b.share = share
	return nil
}
