package device

import (
	"context"
	"time"
)

// Dim3 is a grid or block dimension of a kernel launch; zero components count as 1.
type Dim3 struct{ X, Y, Z uint32 }

// Stream is an ordered queue of asynchronous work on one GPU. Enqueueing methods return errors of the call itself
// (bad arguments, a destroyed stream); errors of the work are reported by Synchronize. A stream is used by one
// goroutine at a time.
type Stream interface {
	// GPU the stream runs on.
	GPU() int
	// CopyHtoD copies len(src) bytes from host memory to dst.
	CopyHtoD(dst Ptr, src []byte) error
	// CopyDtoH copies len(dst) bytes from src to host memory.
	CopyDtoH(dst []byte, src Ptr) error
	// CopyDtoD copies size bytes between device addresses; src may be memory of another GPU that this stream's
	// GPU was granted access to (a peer copy).
	CopyDtoD(dst, src Ptr, size uint64) error
	// Memset8 sets n bytes at dst to v.
	Memset8(dst Ptr, v uint8, n uint64) error
	// Memset32 sets n 32-bit words at dst (4-byte aligned) to v.
	Memset32(dst Ptr, v uint32, n uint64) error
	// Launch enqueues kernel f (of a module loaded on this stream's GPU) with the given grid, block, dynamic
	// shared memory and raw argument buffer laid out as f.Params().
	Launch(f Function, grid, block Dim3, sharedMem uint32, args []byte) error
	// Record records e at this point of the stream; e completes when the work before it has.
	Record(e Event) error
	// Wait makes later work of this stream wait until e completes (e may belong to another GPU's stream).
	Wait(e Event) error
	// Synchronize waits until all work of the stream has completed and returns its first error, or ctx's.
	Synchronize(ctx context.Context) error
	// Destroy releases the stream after its work has completed.
	Destroy() error
}

// Event marks a point in a stream.
type Event interface {
	// Query reports whether the work before the last Record has completed (true for a never-recorded event), and
	// that work's error.
	Query() (bool, error)
	// Synchronize waits until the work before the last Record has completed, or ctx ends.
	Synchronize(ctx context.Context) error
	// Elapsed is the time from start's last Record completing to this event's, both timed events
	// (Backend.NewTimedEvent) of one GPU: ErrInvalidValue for an event without timing or never recorded,
	// ErrNotReady while either has not completed.
	Elapsed(start Event) (time.Duration, error)
	// Destroy releases the event.
	Destroy() error
}
