// Package memory manages device memory for the gpuserver (docs/design.md, decision 2).
//
// Physical memory: at start, a configurable share of each GPU's memory is created as physical chunks of the
// driver's granularity (ChunkPool), so no driver allocation sits on the request path. Because the driver maps
// physical memory at any granularity-aligned address, a block needs any n free chunks, not n adjacent ones: the
// chunk pool has no external fragmentation at all, which is better than a buddy allocator over one big physical
// region (Torpor's), and taking chunks is O(n). Chunks are handed out lowest index first, so a model's blocks end
// up together and a freed model's chunks are reused first by the next one.
//
// Addresses: each function has an AddressSpace. Every block the function allocates gets a device address reserved
// once, valid on every GPU, that never changes while the function exists. Blocks of at least half a chunk get a
// segment (a reservation of whole chunks) of their own; smaller blocks are packed into shared segments of one
// chunk by a buddy allocator (Buddy, 256-byte minimum, the alignment cudaMalloc gives). A segment is the unit of
// mapping, swapping and readiness: the executor maps a segment's chunks at its address on the GPU the function
// runs on, and copies its bytes in.
//
// Blocks allocated before the function's image is captured hold the model (KindModel); blocks allocated after
// are scratch (KindScratch): never in the image. The executor writes the scratch segments that hold a block (Holds)
// back to host memory when the function's copy leaves a GPU and restores them at its next swap-in, unless the
// function declares its scratch per request (then they are mapped zeroed). Blocks a process of the function
// allocates in its own initialisation after the capture (a replica started later) are KindInit: kept like the
// scratch a function keeps, whatever its scratch mode. No two kinds share a segment.
package memory
