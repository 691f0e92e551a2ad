// Package executor moves models onto GPUs and runs a function's remoted work there. A Node holds one Executor per
// GPU (its own copy streams, its health, its group size) and the node-wide state of every function: its address
// space (package memory), and its residencies, the GPUs holding physical memory with its bytes.
//
// Fixed addresses (docs/design.md, decision 2): a function's segments keep their addresses on every GPU. The GPU a
// function runs on has its chunks mapped at those addresses (the function is active there); other GPUs may keep a
// parked copy (chunks allocated, not mapped) that a later swap-in re-maps without a copy, or that serves as the
// source of a GPU-to-GPU swap: the source chunks are mapped at a staging address for the duration of the copy,
// and a pinned source is never evicted.
//
// A swap-in (SwapIn, Acquire) maps the target GPU's chunks segment by segment and enqueues the copies in groups of
// the executor's group size (the elbow of copy throughput against size, ProfileGroupSize), recording an event per
// segment; it returns once everything is enqueued. Work submitted through a function's Stream waits only for the
// segments its arguments point into, so kernels start before the last group lands (per-block readiness). Evict
// invalidates the model: its chunks go back to the pool and no model segment is copied back (docs/design.md,
// decision 3), except for a function whose initialisation has not ended (no image yet): its bytes are written back
// to the host and restored at its next swap-in, and its initialisation goes on (only its first request ends it), so
// blocks it allocates afterwards are still part of its model. Scratch segments (allocated after Capture) are the
// function's own state by default: written back to host memory when its copy leaves a GPU and restored, per segment
// like the model, at its next swap-in; a function that declares its scratch per request gets it mapped zeroed
// instead (scratch.go). A GPU whose work fails is marked unhealthy; its residencies are dropped and later acquires
// without a GPU go elsewhere.
package executor
