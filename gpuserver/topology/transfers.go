package topology

import (
	"math"
	"slices"
	"time"
)

// Transfers is the set of transfers in progress on one node, advanced as a fluid: every transfer moves its bytes
// at the rate the link model (Rate) gives it among the transfers running at that moment, and the rates of all of
// them are recomputed whenever one starts or ends. So contention is two-sided (a transfer that starts slows the
// ones already running, and one that ends speeds up the rest), and a transfer counts as running until its last
// byte has moved. A transfer first waits the node's fixed TransferLatencySec (counted as running), then moves its
// bytes.
//
// The simulator advances one Transfers as the truth of a node's links; the controller keeps another to predict
// when the transfers in progress end and how long a new one would take. It is not safe for concurrent use.
type Transfers struct {
	node *Node
	at   time.Time // the instant the flows' remaining amounts refer to
	fs   []flow
	buf  []Path
}

type flow struct {
	id    uint64
	path  Path
	wait  float64 // seconds of fixed latency left
	left  float64 // bytes left
	rate  float64 // bytes per second at the current set of transfers
	start time.Time
}

// TransferEnd is when one transfer ends.
type TransferEnd struct {
	ID   uint64
	Path Path
	At   time.Time
}

// NewTransfers returns an empty set of transfers on node, which must not change while the set is in use.
func NewTransfers(node *Node) *Transfers { return &Transfers{node: node} }

// Len is the number of transfers in progress.
func (t *Transfers) Len() int { return len(t.fs) }

// Paths lists the paths of the transfers in progress, in the order they started.
func (t *Transfers) Paths() []Path {
	out := make([]Path, len(t.fs))
	for i, f := range t.fs {
		out[i] = f.path
	}
	return out
}

// Has reports whether transfer id is in progress.
func (t *Transfers) Has(id uint64) bool { return t.index(id) >= 0 }

// Started is when transfer id started; ok is false when it is not in progress.
func (t *Transfers) Started(id uint64) (time.Time, bool) {
	if i := t.index(id); i >= 0 {
		return t.fs[i].start, true
	}
	return time.Time{}, false
}

func (t *Transfers) index(id uint64) int {
	return slices.IndexFunc(t.fs, func(f flow) bool { return f.id == id })
}

// Start adds transfer id of bytes over p at now (not before the last change). An id already in progress is
// replaced.
func (t *Transfers) Start(now time.Time, id uint64, p Path, bytes uint64) {
	t.advance(now)
	if i := t.index(id); i >= 0 {
		t.fs = slices.Delete(t.fs, i, i+1)
	}
	t.fs = append(t.fs, flow{id: id, path: p, wait: t.node.TransferLatencySec, left: float64(bytes), start: now})
	t.rerate(t.fs)
}

// End removes transfer id at now, finished or not; it reports whether it was in progress.
func (t *Transfers) End(now time.Time, id uint64) bool {
	i := t.index(id)
	if i < 0 {
		return false
	}
	t.advance(now)
	t.fs = slices.Delete(t.fs, i, i+1)
	t.rerate(t.fs)
	return true
}

// Next is the transfer that ends first if nothing starts or ends before, and when it ends.
func (t *Transfers) Next() (TransferEnd, bool) {
	if len(t.fs) == 0 {
		return TransferEnd{}, false
	}
	d, i := next(t.fs)
	return TransferEnd{ID: t.fs[i].id, Path: t.fs[i].path, At: t.at.Add(d)}, true
}

// Ends projects when each transfer in progress ends if none other starts, in order of their ends; now must not
// be before the last change.
func (t *Transfers) Ends(now time.Time) []TransferEnd {
	return t.drain(now, t.project(now))
}

// EndsWith projects, like Ends, when each transfer in progress ends if a transfer of bytes over p started now and
// none other; the added transfer is not listed.
func (t *Transfers) EndsWith(now time.Time, p Path, bytes uint64) []TransferEnd {
	const added = math.MaxUint64
	fs := append(t.project(now), flow{id: added, path: p, wait: t.node.TransferLatencySec, left: float64(bytes)})
	t.rerate(fs)
	return slices.DeleteFunc(t.drain(now, fs), func(e TransferEnd) bool { return e.ID == added })
}

// drain runs fs from at until all have ended, none other starting, and lists their ends in order.
func (t *Transfers) drain(at time.Time, fs []flow) []TransferEnd {
	out := make([]TransferEnd, 0, len(fs))
	for len(fs) > 0 {
		var i int
		at, i = t.step(at, fs)
		out = append(out, TransferEnd{ID: fs[i].id, Path: fs[i].path, At: at})
		fs = slices.Delete(fs, i, i+1)
		t.rerate(fs)
	}
	return out
}

// Predict is how long a transfer of bytes over p would take if it started at at (not before now), while the
// transfers in progress run to their ends and none other starts.
func (t *Transfers) Predict(now, at time.Time, p Path, bytes uint64) time.Duration {
	if at.Before(now) {
		at = now
	}
	fs := t.project(now)
	cur := now
	for len(fs) > 0 { // run the transfers in progress up to at
		nx, i := next(fs)
		end := cur.Add(nx)
		if end.After(at) {
			break
		}
		advanceFlows(fs, end.Sub(cur))
		cur = end
		fs = slices.Delete(fs, i, i+1)
		t.rerate(fs)
	}
	advanceFlows(fs, at.Sub(cur))
	const self = math.MaxUint64
	fs = append(fs, flow{id: self, path: p, wait: t.node.TransferLatencySec, left: float64(bytes)})
	t.rerate(fs)
	cur = at
	for {
		var i int
		cur, i = t.step(cur, fs)
		if fs[i].id == self {
			return cur.Sub(at)
		}
		fs = slices.Delete(fs, i, i+1)
		t.rerate(fs)
	}
}

// project copies the flows advanced to now.
func (t *Transfers) project(now time.Time) []flow {
	fs := slices.Clone(t.fs)
	if now.After(t.at) {
		advanceFlows(fs, now.Sub(t.at))
	}
	return fs
}

// step advances fs from at to the first end among them and returns that instant and the index of the flow
// ending.
func (t *Transfers) step(at time.Time, fs []flow) (time.Time, int) {
	d, i := next(fs)
	advanceFlows(fs, d)
	return at.Add(d), i
}

func next(fs []flow) (time.Duration, int) {
	best, bestD := 0, fs[0].remaining()
	for i := 1; i < len(fs); i++ {
		if d := fs[i].remaining(); d < bestD {
			best, bestD = i, d
		}
	}
	return bestD, best
}

// remaining is the flow's time to its end at its current rate.
func (f flow) remaining() time.Duration {
	sec := f.wait
	if f.left > 0 {
		sec += f.left / f.rate
	}
	return time.Duration(math.Round(sec * float64(time.Second)))
}

func (t *Transfers) advance(now time.Time) {
	if now.After(t.at) {
		if !t.at.IsZero() {
			advanceFlows(t.fs, now.Sub(t.at))
		}
		t.at = now
	}
}

func advanceFlows(fs []flow, d time.Duration) {
	sec := d.Seconds()
	for i := range fs {
		f := &fs[i]
		s := sec
		if f.wait > 0 {
			w := min(f.wait, s)
			f.wait -= w
			s -= w
		}
		if s > 0 {
			f.left = max(0, f.left-f.rate*s)
		}
	}
}

// rerate recomputes the rate of every flow among fs.
func (t *Transfers) rerate(fs []flow) {
	t.buf = t.buf[:0]
	for _, f := range fs {
		t.buf = append(t.buf, f.path)
	}
	for i := range fs {
		fs[i].rate = t.node.Rate(fs[i].path, t.buf)
	}
}
