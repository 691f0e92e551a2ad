package executor

// How the node is locked.
//
// Two locks, always taken in this order:
//
//   - Node.op orders the operations that change where functions' memory is (swap-in, acquire, eviction,
//     deactivation, capture, allocation and free, scratch drops, faults, resets, the end of a swap): one at a time,
//     as a single lock ordered them before. An operation takes it with operate.
//   - Node.mu guards the state (functions, residencies, contexts, counters). It is never held across a wait on the
//     device (a stream's or an event's Synchronize), a mapping call of the driver (map, unmap, access), a chunk
//     borrowed from another process, or the write of an image: the operation releases it around such a call
//     (unlocked) and takes it again after.
//
// While mu is released, work submitted through a function's Stream (gate) and the readers of the state (Status,
// Binding.Err, ...) go on: so one function's swap, eviction or capture never stalls another function's launches.
// What keeps that safe:
//
//   - A function whose memory an operation is changing is marked moving (Node.moving) for as long as the change
//     lasts; work submitted through its Stream waits until it has settled (gate, Node.Stream), exactly as it waited
//     for the single lock before, and then sees the new state (no longer active there, another epoch...). So
//     nothing is queued on memory being mapped or unmapped, and the events and streams the operation waits on are
//     not destroyed under it.
//   - Every other change of a function's placement holds op, so the state an operation left before it released mu
//     is the state it finds after: only the counters of bindings may drop meanwhile (Release, Expire), and new
//     functions may be registered (operations iterate over a snapshot of the functions, never over the map across a
//     release of mu).
//   - The few paths that take op after having looked at the state under mu alone re-check it once they hold op: a
//     fault found by gate or by Stream.Synchronize (the context may have been torn down meanwhile), the end of a
//     binding that expired (the function may have been moved, restored after a fault or reset).
//
// Host memory that a queued copy reads or writes (an image's pages) stays mapped until the stream has passed the
// copy, even when the wait for it ends early (see writeImageLocked and completeLocked).

// operate takes the node for an operation: op, then mu. The returned function gives both back.
func (n *Node) operate() (end func()) {
	n.op.Lock()
	n.mu.Lock()
	n.operating = true
	return n.endOperation
}

// tryOperate is operate when no other operation is running; false (taking nothing) otherwise.
func (n *Node) tryOperate() (end func(), ok bool) {
	if !n.op.TryLock() {
		return nil, false
	}
	n.mu.Lock()
	n.operating = true
	return n.endOperation, true
}

func (n *Node) endOperation() {
	n.operating = false
	n.mu.Unlock()
	n.op.Unlock()
}

// moving marks f as moving until the returned function is called (with mu held): work submitted through f's
// Stream waits meanwhile.
func (n *Node) moving(f *function) (settled func()) {
	f.moving++
	return func() {
		if f.moving--; f.moving == 0 {
			n.settled.Broadcast()
		}
	}
}

// settleLocked waits (releasing mu meanwhile) until f is not moving.
func (n *Node) settleLocked(f *function) {
	for f.moving > 0 {
		n.settled.Wait()
	}
}

// unlocked runs call with mu released: a wait on the device, a mapping call, a chunk borrowed, an image written.
// The caller holds op and mu (it runs an operation) and has marked moving the functions whose state call waits on
// or changes.
func (n *Node) unlocked(call func() error) error {
	if !n.operating {
		panic("executor: mu released outside an operation (only an operation, holding op, may release it)")
	}
	n.mu.Unlock()
	defer n.mu.Lock()
	return call()
}
