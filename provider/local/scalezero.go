package local

import "strconv"

// Scale from zero: a request to a function at 0 replicas starts replicas again, as the OpenFaaS gateway's
// scale-from-zero does (it scales the function to its minimum and waits up to its ready timeout for one to be
// ready), so that the first call after a scale to zero wakes the function instead of failing. Route holds b.mu
// from the moment it sees 0 desired replicas until the new count is recorded, so concurrent first calls start one
// replica between them: the first scales, the others find replicas starting and wait with it.

// wakeReplicas is how many replicas a function scaled to zero wakes with: its LabelScaleMin, at least 1.
func wakeReplicas(rec record, maxReplicas uint64) uint64 {
	if rec.Deployment.Labels != nil {
		if n, err := strconv.ParseUint((*rec.Deployment.Labels)[LabelScaleMin], 10, 64); err == nil && n > 0 {
			return min(n, maxReplicas)
		}
	}
	return 1
}

// scaleFromZeroLocked starts the replicas of a function a request found at 0 replicas and records the new count;
// b.mu is held.
func (b *Backend) scaleFromZeroLocked(fn *function) error {
	rec := fn.rec
	rec.Replicas = wakeReplicas(rec, b.cfg.MaxReplicas)
	if err := b.saveRecord(rec); err != nil {
		return err
	}
	fn.rec = rec
	b.scaleLocked(fn, rec.Replicas, false)
	fn.event("", "scaled from zero to %d by a request", rec.Replicas)
	b.log.Info("function scaled from zero by a request", "function", fn.name, "replicas", rec.Replicas)
	return nil
}
