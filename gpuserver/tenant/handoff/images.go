package handoff

// The module images hand-off: every executor holds its tenant's module images (the code its functions load), each
// bounded per function in the executor, and the node's bound holds over all executors together: an executor
// reserves the bytes of an image (or of its chunks being received) with the gpuserver before it keeps them
// (KindReserveImages; refused beyond the node's bound), and gives them back when it drops them (KindReleaseImages);
// both are answered, so that they reach the gpuserver in the order the executor made them. An executor that ends
// gives back everything it reserved.
const (
	KindReserveImages Kind = 45 // ImageBytes (answered); minor version 2
	KindReleaseImages Kind = 46 // ImageBytes (answered); minor version 2
)

// ImageBytes are bytes of module images reserved or given back.
type ImageBytes struct {
	Bytes uint64 `json:"bytes"`
}
