package device

// FuncAttr is a CUfunction_attribute (cuda.h).
type FuncAttr int32

// Function attributes.
const (
	FuncMaxThreadsPerBlock                FuncAttr = 0
	FuncSharedSizeBytes                   FuncAttr = 1
	FuncConstSizeBytes                    FuncAttr = 2
	FuncLocalSizeBytes                    FuncAttr = 3
	FuncNumRegs                           FuncAttr = 4
	FuncPTXVersion                        FuncAttr = 5
	FuncBinaryVersion                     FuncAttr = 6
	FuncCacheModeCA                       FuncAttr = 7
	FuncMaxDynamicSharedSizeBytes         FuncAttr = 8
	FuncPreferredSharedMemoryCarveout     FuncAttr = 9
	FuncClusterSizeMustBeSet              FuncAttr = 10
	FuncRequiredClusterWidth              FuncAttr = 11
	FuncRequiredClusterHeight             FuncAttr = 12
	FuncRequiredClusterDepth              FuncAttr = 13
	FuncNonPortableClusterSizeAllowed     FuncAttr = 14
	FuncClusterSchedulingPolicyPreference FuncAttr = 15
	FuncAttrCount                         FuncAttr = 16
)

// Settable reports whether a can be set with cuFuncSetAttribute.
func (a FuncAttr) Settable() bool {
	switch a {
	case FuncMaxDynamicSharedSizeBytes, FuncPreferredSharedMemoryCarveout, FuncRequiredClusterWidth,
		FuncRequiredClusterHeight, FuncRequiredClusterDepth, FuncNonPortableClusterSizeAllowed,
		FuncClusterSchedulingPolicyPreference:
		return true
	}
	return false
}

// ConfigurableFunction is a Function whose driver answers every attribute (cuFuncGetAttribute) and takes the
// settable ones (cuFuncSetAttribute): the cuda backend's. A set applies to this function of this module on this
// GPU only: callers replay sets on the same kernel loaded on another GPU. (A function that only knows its static
// resources from its image is an AttributedFunction.)
type ConfigurableFunction interface {
	Function
	Attribute(a FuncAttr) (int32, error)
	SetAttribute(a FuncAttr, v int32) error
}

// EnumerableModule is a Module that lists its kernels (cuLibraryEnumerateKernels).
type EnumerableModule interface {
	Module
	// FunctionNames are the names of the module's kernels, in the module's order.
	FunctionNames() []string
}

// LaunchAttribute is one CUlaunchAttribute of cuLaunchKernelEx: its CUlaunchAttributeID and 64-byte value as
// cuda.h lays it out. For the attributes whose value names an event (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT,
// CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) Event is that event, and the value's first 8 bytes are
// meaningless to the backend.
type LaunchAttribute struct {
	ID    uint32
	Value [64]byte
	Event Event
}

// Launch attribute ids (CUlaunchAttributeID).
const (
	LaunchAttrIgnore                            = 0
	LaunchAttrAccessPolicyWindow                = 1
	LaunchAttrCooperative                       = 2
	LaunchAttrSynchronizationPolicy             = 3
	LaunchAttrClusterDimension                  = 4
	LaunchAttrClusterSchedulingPolicyPreference = 5
	LaunchAttrProgrammaticStreamSerialization   = 6
	LaunchAttrProgrammaticEvent                 = 7
	LaunchAttrPriority                          = 8
	LaunchAttrMemSyncDomainMap                  = 9
	LaunchAttrMemSyncDomain                     = 10
	LaunchAttrPreferredClusterDimension         = 11
	LaunchAttrLaunchCompletionEvent             = 12
	LaunchAttrDeviceUpdatableKernelNode         = 13
	LaunchAttrPreferredSharedMemoryCarveout     = 14
	LaunchAttrNvlinkUtilCentricScheduling       = 16
	LaunchAttrMax                               = 17
)

// ExtendedLauncher is a Stream that launches with attributes (cuLaunchKernelEx): clusters, cooperative launches,
// programmatic dependent launch, priorities, completion events. A backend applies every attribute as the driver
// does or refuses the launch.
type ExtendedLauncher interface {
	LaunchEx(f Function, grid, block Dim3, sharedMem uint32, attrs []LaunchAttribute, args []byte) error
}

// TensorMapRequest holds the arguments of cuTensorMapEncodeTiled (Kind TensorMapTiled), cuTensorMapEncodeIm2col
// (TensorMapIm2col) or cuTensorMapEncodeIm2colWide (TensorMapIm2colWide), as cuda.h declares them.
type TensorMapRequest struct {
	Kind          int
	DataType      uint32
	Rank          uint32
	GlobalAddress Ptr
	GlobalDim     [5]uint64
	GlobalStrides [4]uint64 // Rank-1 strides in bytes
	BoxDim        [5]uint32 // tiled only
	ElementStride [5]uint32
	Interleave    uint32
	Swizzle       uint32
	L2Promotion   uint32
	OOBFill       uint32
	// im2col: pixel box corners (Rank-2 of them; one each for im2col wide), channels and pixels.
	PixelBoxLowerCorner [3]int32
	PixelBoxUpperCorner [3]int32
	ChannelsPerPixel    uint32
	PixelsPerColumn     uint32
	Mode                uint32 // im2col wide
}

// Tensor map kinds.
const (
	TensorMapTiled      = 1
	TensorMapIm2col     = 2
	TensorMapIm2colWide = 3
)

// TensorMapEncoder is a Backend that encodes tensor map descriptors (TMA) for a GPU: a host-side computation of
// the driver whose 128-byte result depends on the GPU and driver, so it runs where the driver is.
type TensorMapEncoder interface {
	EncodeTensorMap(gpu int, req TensorMapRequest) ([128]byte, error)
	// ReplaceTensorMapAddress returns m with its global address replaced (cuTensorMapReplaceAddress).
	ReplaceTensorMapAddress(gpu int, m [128]byte, addr Ptr) ([128]byte, error)
}
