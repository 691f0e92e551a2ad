// Package attrs holds device attribute tables: the value of every CUdevice_attribute of CUDA 13.0 for a GPU.
// The cuda backend reads a real GPU's table from the driver; the simulated node reports the complete table of the
// GPU model it simulates (Model), so that cuBLAS, cuDNN and PyTorch, which pick kernels and code paths from these
// attributes, behave as on that GPU. The remoting server sends the table to the shim at connection.
package attrs

// Attr is a CUdevice_attribute value (cuda.h).
type Attr int

// Count is CU_DEVICE_ATTRIBUTE_MAX of CUDA 13.0: attributes are 1..Count-1.
const Count = 148

// Table is a GPU's attribute values indexed by Attr (index 0 is unused).
type Table [Count]int32

// Get returns the value of a, 0 for an attribute outside the table.
func (t *Table) Get(a Attr) int32 {
	if a <= 0 || int(a) >= Count {
		return 0
	}
	return t[a]
}

// The attributes of CUDA 13.0 by their cuda.h names (CU_DEVICE_ATTRIBUTE_ in CamelCase; where cuda.h has two
// names for a value, the first).
const (
	MaxThreadsPerBlock                       Attr = 1
	MaxBlockDimX                             Attr = 2
	MaxBlockDimY                             Attr = 3
	MaxBlockDimZ                             Attr = 4
	MaxGridDimX                              Attr = 5
	MaxGridDimY                              Attr = 6
	MaxGridDimZ                              Attr = 7
	MaxSharedMemoryPerBlock                  Attr = 8
	TotalConstantMemory                      Attr = 9
	WarpSize                                 Attr = 10
	MaxPitch                                 Attr = 11
	MaxRegistersPerBlock                     Attr = 12
	ClockRate                                Attr = 13
	TextureAlignment                         Attr = 14
	GpuOverlap                               Attr = 15
	MultiprocessorCount                      Attr = 16
	KernelExecTimeout                        Attr = 17
	Integrated                               Attr = 18
	CanMapHostMemory                         Attr = 19
	ComputeMode                              Attr = 20
	MaximumTexture1dWidth                    Attr = 21
	MaximumTexture2dWidth                    Attr = 22
	MaximumTexture2dHeight                   Attr = 23
	MaximumTexture3dWidth                    Attr = 24
	MaximumTexture3dHeight                   Attr = 25
	MaximumTexture3dDepth                    Attr = 26
	MaximumTexture2dLayeredWidth             Attr = 27
	MaximumTexture2dLayeredHeight            Attr = 28
	MaximumTexture2dLayeredLayers            Attr = 29
	SurfaceAlignment                         Attr = 30
	ConcurrentKernels                        Attr = 31
	EccEnabled                               Attr = 32
	PciBusId                                 Attr = 33
	PciDeviceId                              Attr = 34
	TccDriver                                Attr = 35
	MemoryClockRate                          Attr = 36
	GlobalMemoryBusWidth                     Attr = 37
	L2CacheSize                              Attr = 38
	MaxThreadsPerMultiprocessor              Attr = 39
	AsyncEngineCount                         Attr = 40
	UnifiedAddressing                        Attr = 41
	MaximumTexture1dLayeredWidth             Attr = 42
	MaximumTexture1dLayeredLayers            Attr = 43
	CanTex2dGather                           Attr = 44
	MaximumTexture2dGatherWidth              Attr = 45
	MaximumTexture2dGatherHeight             Attr = 46
	MaximumTexture3dWidthAlternate           Attr = 47
	MaximumTexture3dHeightAlternate          Attr = 48
	MaximumTexture3dDepthAlternate           Attr = 49
	PciDomainId                              Attr = 50
	TexturePitchAlignment                    Attr = 51
	MaximumTexturecubemapWidth               Attr = 52
	MaximumTexturecubemapLayeredWidth        Attr = 53
	MaximumTexturecubemapLayeredLayers       Attr = 54
	MaximumSurface1dWidth                    Attr = 55
	MaximumSurface2dWidth                    Attr = 56
	MaximumSurface2dHeight                   Attr = 57
	MaximumSurface3dWidth                    Attr = 58
	MaximumSurface3dHeight                   Attr = 59
	MaximumSurface3dDepth                    Attr = 60
	MaximumSurface1dLayeredWidth             Attr = 61
	MaximumSurface1dLayeredLayers            Attr = 62
	MaximumSurface2dLayeredWidth             Attr = 63
	MaximumSurface2dLayeredHeight            Attr = 64
	MaximumSurface2dLayeredLayers            Attr = 65
	MaximumSurfacecubemapWidth               Attr = 66
	MaximumSurfacecubemapLayeredWidth        Attr = 67
	MaximumSurfacecubemapLayeredLayers       Attr = 68
	MaximumTexture1dLinearWidth              Attr = 69
	MaximumTexture2dLinearWidth              Attr = 70
	MaximumTexture2dLinearHeight             Attr = 71
	MaximumTexture2dLinearPitch              Attr = 72
	MaximumTexture2dMipmappedWidth           Attr = 73
	MaximumTexture2dMipmappedHeight          Attr = 74
	ComputeCapabilityMajor                   Attr = 75
	ComputeCapabilityMinor                   Attr = 76
	MaximumTexture1dMipmappedWidth           Attr = 77
	StreamPrioritiesSupported                Attr = 78
	GlobalL1CacheSupported                   Attr = 79
	LocalL1CacheSupported                    Attr = 80
	MaxSharedMemoryPerMultiprocessor         Attr = 81
	MaxRegistersPerMultiprocessor            Attr = 82
	ManagedMemory                            Attr = 83
	MultiGpuBoard                            Attr = 84
	MultiGpuBoardGroupId                     Attr = 85
	HostNativeAtomicSupported                Attr = 86
	SingleToDoublePrecisionPerfRatio         Attr = 87
	PageableMemoryAccess                     Attr = 88
	ConcurrentManagedAccess                  Attr = 89
	ComputePreemptionSupported               Attr = 90
	CanUseHostPointerForRegisteredMem        Attr = 91
	CanUseStreamMemOpsV1                     Attr = 92
	CanUse64BitStreamMemOpsV1                Attr = 93
	CanUseStreamWaitValueNorV1               Attr = 94
	CooperativeLaunch                        Attr = 95
	CooperativeMultiDeviceLaunch             Attr = 96
	MaxSharedMemoryPerBlockOptin             Attr = 97
	CanFlushRemoteWrites                     Attr = 98
	HostRegisterSupported                    Attr = 99
	PageableMemoryAccessUsesHostPageTables   Attr = 100
	DirectManagedMemAccessFromHost           Attr = 101
	VirtualAddressManagementSupported        Attr = 102
	HandleTypePosixFileDescriptorSupported   Attr = 103
	HandleTypeWin32HandleSupported           Attr = 104
	HandleTypeWin32KmtHandleSupported        Attr = 105
	MaxBlocksPerMultiprocessor               Attr = 106
	GenericCompressionSupported              Attr = 107
	MaxPersistingL2CacheSize                 Attr = 108
	MaxAccessPolicyWindowSize                Attr = 109
	GpuDirectRdmaWithCudaVmmSupported        Attr = 110
	ReservedSharedMemoryPerBlock             Attr = 111
	SparseCudaArraySupported                 Attr = 112
	ReadOnlyHostRegisterSupported            Attr = 113
	TimelineSemaphoreInteropSupported        Attr = 114
	MemoryPoolsSupported                     Attr = 115
	GpuDirectRdmaSupported                   Attr = 116
	GpuDirectRdmaFlushWritesOptions          Attr = 117
	GpuDirectRdmaWritesOrdering              Attr = 118
	MempoolSupportedHandleTypes              Attr = 119
	ClusterLaunch                            Attr = 120
	DeferredMappingCudaArraySupported        Attr = 121
	CanUse64BitStreamMemOps                  Attr = 122
	CanUseStreamWaitValueNor                 Attr = 123
	DmaBufSupported                          Attr = 124
	IpcEventSupported                        Attr = 125
	MemSyncDomainCount                       Attr = 126
	TensorMapAccessSupported                 Attr = 127
	HandleTypeFabricSupported                Attr = 128
	UnifiedFunctionPointers                  Attr = 129
	NumaConfig                               Attr = 130
	NumaId                                   Attr = 131
	MulticastSupported                       Attr = 132
	MpsEnabled                               Attr = 133
	HostNumaId                               Attr = 134
	D3d12CigSupported                        Attr = 135
	MemDecompressAlgorithmMask               Attr = 136
	MemDecompressMaximumLength               Attr = 137
	VulkanCigSupported                       Attr = 138
	GpuPciDeviceId                           Attr = 139
	GpuPciSubsystemId                        Attr = 140
	HostNumaVirtualMemoryManagementSupported Attr = 141
	HostNumaMemoryPoolsSupported             Attr = 142
	HostNumaMultinodeIpcSupported            Attr = 143
	HostMemoryPoolsSupported                 Attr = 144
	HostVirtualMemoryManagementSupported     Attr = 145
	HostAllocDmaBufSupported                 Attr = 146
	OnlyPartialHostNativeAtomicSupported     Attr = 147
)
