package handoff

// The chunks hand-off: physical memory is the gpuserver's (every GPU's chunks, created at start), lent to executors
// by descriptor. An executor borrows (KindBorrow: the reply Lent carries one descriptor per chunk, in order: a POSIX
// file descriptor of the CUDA allocation, or the sim's memfd), imports and maps them at its functions' fixed
// addresses, and gives them back (KindReturn) only when nothing maps them. The gpuserver asks for free chunks back
// when another executor runs short (KindReclaim; with Evict, the executor also evicts idle copies of its functions
// on that GPU, if it is not busy). A chunk passing to another executor is zeroed by the gpuserver first.
const (
	KindBorrow  Kind = 20
	KindReturn  Kind = 21
	KindReclaim Kind = 22
)

// MaxBorrow bounds the chunks of one Borrow (their descriptors travel in one frame).
const MaxBorrow = 128

// Borrow asks for N chunks of GPU GPU (N at most MaxBorrow).
type Borrow struct {
	GPU int `json:"gpu"`
	N   int `json:"n"`
}

// Lent answers Borrow: the chunks' indexes in the gpuserver's pool and their size. Files: one per index.
type Lent struct {
	GPU     int    `json:"gpu"`
	Indexes []int  `json:"indexes"`
	Size    uint64 `json:"size"`
}

// Return gives chunks back (the executor released its handles on them).
type Return struct {
	GPU     int   `json:"gpu"`
	Indexes []int `json:"indexes"`
}

// Reclaim asks an executor for up to N free chunks of GPU GPU; with Evict it may evict idle copies to free them.
type Reclaim struct {
	GPU   int  `json:"gpu"`
	N     int  `json:"n"`
	Evict bool `json:"evict,omitempty"`
}

// Reclaimed answers Reclaim: the chunks given back.
type Reclaimed struct {
	GPU     int   `json:"gpu"`
	Indexes []int `json:"indexes"`
}
