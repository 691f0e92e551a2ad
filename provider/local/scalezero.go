package local

// Scale from zero: a request to a function at 0 replicas starts replicas again, as the OpenFaaS gateway's
// scale-from-zero does (it scales the function to its minimum and waits up to its ready timeout for one to be
// ready), so that the first call after a scale to zero wakes the function instead of failing. Route holds b.mu
// from the moment it sees 0 desired replicas until the new count is recorded, so concurrent first calls start one
// replica between them: the first scales, the others find replicas starting and wait with it.

// scaleFromZeroLocked starts the replicas of a function a request found at 0 replicas and records the new count;
// b.mu is held.
func (b *Backend) scaleFromZeroLocked(fn *function) error {
	n := min(fn.scaling.Wake(), b.cfg.MaxReplicas) // its LabelScaleMin, at least 1
	if _, err := b.setReplicasLocked(fn, n); err != nil {
		return err
	}
	fn.event("", "scaled from zero to %d by a request", n)
	b.log.Info("function scaled from zero by a request", "function", fn.name, "replicas", n)
	return nil
}
