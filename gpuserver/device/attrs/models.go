package attrs

import (
	"fmt"
	"strings"
)

// A Model is a GPU model whose complete table the package knows.
type Model struct {
	// Name as the driver reports it, e.g. "NVIDIA H100 80GB HBM3".
	Name string
	// PCIDeviceID is the 16-bit PCI device id (vendor 0x10de).
	PCIDeviceID uint16
	// PCISubsystemID is the 16-bit PCI subsystem id (subsystem vendor 0x10de).
	PCISubsystemID uint16
	table          func() Table
}

// Table returns the model's attribute table. The PCI bus and device ids (PCIBusID, PCIDeviceID attributes) are
// those of the GPU's slot: set them with SetPCI.
func (m Model) Table() Table { return m.table() }

// Models are the GPU models of the simulated node presets. The H100's table is the one the real GPU reports
// (shim/testdata/trace/device-h100.tsv, pinned by a test); the others follow their architecture's documented
// limits and the same driver's conventions. CUDA 13 dropped sm_70 from its compilers and libraries but its
// driver (r580) still runs a V100: the V100 model reports compute capability 7.0 as that driver does, so CUDA 13
// libraries and PyTorch refuse it as they would on the real GPU (the simulated device finds no sm_70 code in
// their modules); the A100, H100 and H200 models run them.
var Models = []Model{
	{Name: "Tesla V100-SXM2-32GB", PCIDeviceID: 0x1db5, PCISubsystemID: 0x1249, table: volta},
	{Name: "NVIDIA A100-SXM4-80GB", PCIDeviceID: 0x20b2, PCISubsystemID: 0x1463, table: ampere},
	{Name: "NVIDIA H100 80GB HBM3", PCIDeviceID: 0x2330, PCISubsystemID: 0x16c1, table: hopper},
	{Name: "NVIDIA H200", PCIDeviceID: 0x2335, PCISubsystemID: 0x18be, table: hopperH200},
}

// ForModel returns the model called name (a simulated GPU's name may carry a suffix such as " (simulated)").
func ForModel(name string) (Model, error) {
	for _, m := range Models {
		if name == m.Name || strings.HasPrefix(name, m.Name+" ") {
			return m, nil
		}
	}
	var known []string
	for _, m := range Models {
		known = append(known, m.Name)
	}
	return Model{}, fmt.Errorf("no attribute table for GPU model %q (known: %s)", name, strings.Join(known, ", "))
}

// ComputeCapability is the model's major*10+minor.
func (m Model) ComputeCapability() int {
	t := m.table()
	return int(t[ComputeCapabilityMajor]*10 + t[ComputeCapabilityMinor])
}

// ForArch returns the model of an architecture (compute capability major*10+minor): the V100 for 7.x, the A100
// for 8.x, the H100 for 9.0 and anything newer (the newest table the package has).
func ForArch(cc int) Model {
	switch {
	case cc < 80:
		return Models[0]
	case cc < 90:
		return Models[1]
	}
	return Models[2]
}

// SetPCI sets the PCI location and identity attributes of a GPU of model m.
func (t *Table) SetPCI(m Model, domain, bus, device int) {
	t[PciDomainId] = int32(domain)
	t[PciBusId] = int32(bus)
	t[PciDeviceId] = int32(device)
	t[GpuPciDeviceId] = int32(uint32(m.PCIDeviceID)<<16 | 0x10de)
	t[GpuPciSubsystemId] = int32(uint32(m.PCISubsystemID)<<16 | 0x10de)
}

func build(kv ...map[Attr]int32) Table {
	var t Table
	for _, m := range kv {
		for k, v := range m {
			t[k] = v
		}
	}
	return t
}

// common holds the values shared by every model since Volta (CUDA 13, Linux, a discrete GPU in a server).
var common = map[Attr]int32{
	MaxThreadsPerBlock: 1024, MaxBlockDimX: 1024, MaxBlockDimY: 1024, MaxBlockDimZ: 64,
	MaxGridDimX: 2147483647, MaxGridDimY: 65535, MaxGridDimZ: 65535,
	MaxSharedMemoryPerBlock: 49152, TotalConstantMemory: 65536, WarpSize: 32, MaxPitch: 2147483647,
	MaxRegistersPerBlock: 65536, TextureAlignment: 512, GpuOverlap: 1, KernelExecTimeout: 0, Integrated: 0,
	CanMapHostMemory: 1, ComputeMode: 0,
	MaximumTexture1dWidth: 131072, MaximumTexture2dWidth: 131072, MaximumTexture2dHeight: 65536,
	MaximumTexture3dWidth: 16384, MaximumTexture3dHeight: 16384, MaximumTexture3dDepth: 16384,
	MaximumTexture2dLayeredWidth: 32768, MaximumTexture2dLayeredHeight: 32768,
	MaximumTexture2dLayeredLayers: 2048, SurfaceAlignment: 512, ConcurrentKernels: 1, EccEnabled: 1,
	TccDriver: 0, MaxThreadsPerMultiprocessor: 2048, UnifiedAddressing: 1,
	MaximumTexture1dLayeredWidth: 32768, MaximumTexture1dLayeredLayers: 2048, CanTex2dGather: 1,
	MaximumTexture2dGatherWidth: 32768, MaximumTexture2dGatherHeight: 32768,
	MaximumTexture3dWidthAlternate: 8192, MaximumTexture3dHeightAlternate: 8192,
	MaximumTexture3dDepthAlternate: 32768, TexturePitchAlignment: 32, MaximumTexturecubemapWidth: 32768,
	MaximumTexturecubemapLayeredWidth: 32768, MaximumTexturecubemapLayeredLayers: 2046,
	MaximumSurface1dWidth: 32768, MaximumSurface2dWidth: 131072, MaximumSurface2dHeight: 65536,
	MaximumSurface3dWidth: 16384, MaximumSurface3dHeight: 16384, MaximumSurface3dDepth: 16384,
	MaximumSurface1dLayeredWidth: 32768, MaximumSurface1dLayeredLayers: 2048,
	MaximumSurface2dLayeredWidth: 32768, MaximumSurface2dLayeredHeight: 32768,
	MaximumSurface2dLayeredLayers: 2048, MaximumSurfacecubemapWidth: 32768,
	MaximumSurfacecubemapLayeredWidth: 32768, MaximumSurfacecubemapLayeredLayers: 2046,
	MaximumTexture1dLinearWidth: 268435456, MaximumTexture2dLinearWidth: 131072,
	MaximumTexture2dLinearHeight: 65000, MaximumTexture2dLinearPitch: 2097120,
	MaximumTexture2dMipmappedWidth: 32768, MaximumTexture2dMipmappedHeight: 32768,
	MaximumTexture1dMipmappedWidth: 32768, StreamPrioritiesSupported: 1, GlobalL1CacheSupported: 1,
	LocalL1CacheSupported: 1, MaxRegistersPerMultiprocessor: 65536, ManagedMemory: 1, MultiGpuBoard: 0,
	HostNativeAtomicSupported: 0, SingleToDoublePrecisionPerfRatio: 2, PageableMemoryAccess: 0,
	ConcurrentManagedAccess: 1, ComputePreemptionSupported: 1, CanUseHostPointerForRegisteredMem: 1,
	CanUseStreamMemOpsV1: 0, CanUse64BitStreamMemOpsV1: 0, CanUseStreamWaitValueNorV1: 0, CooperativeLaunch: 1,
	CooperativeMultiDeviceLaunch: 1, CanFlushRemoteWrites: 0, HostRegisterSupported: 1,
	PageableMemoryAccessUsesHostPageTables: 0, DirectManagedMemAccessFromHost: 0,
	VirtualAddressManagementSupported: 1, HandleTypePosixFileDescriptorSupported: 1,
	HandleTypeWin32HandleSupported: 0, HandleTypeWin32KmtHandleSupported: 0, MaxBlocksPerMultiprocessor: 32,
	GpuDirectRdmaWithCudaVmmSupported: 1, ReadOnlyHostRegisterSupported: 1,
	TimelineSemaphoreInteropSupported: 1, MemoryPoolsSupported: 1, GpuDirectRdmaSupported: 1,
	GpuDirectRdmaFlushWritesOptions: 1, GpuDirectRdmaWritesOrdering: 100, MempoolSupportedHandleTypes: 9,
	CanUse64BitStreamMemOps: 1, CanUseStreamWaitValueNor: 1, DmaBufSupported: 1, IpcEventSupported: 1,
	HandleTypeFabricSupported: 0, UnifiedFunctionPointers: 0, NumaConfig: 0, NumaId: -1, MulticastSupported: 0,
	MpsEnabled: 0, HostNumaId: 0, D3d12CigSupported: 0, MemDecompressAlgorithmMask: 0,
	MemDecompressMaximumLength: 0, VulkanCigSupported: 0, HostNumaVirtualMemoryManagementSupported: 1,
	HostNumaMemoryPoolsSupported: 1, HostNumaMultinodeIpcSupported: 0, HostMemoryPoolsSupported: 1,
	HostVirtualMemoryManagementSupported: 1, HostAllocDmaBufSupported: 0, OnlyPartialHostNativeAtomicSupported: 0,
}

func volta() Table {
	return build(common, map[Attr]int32{
		ComputeCapabilityMajor: 7, ComputeCapabilityMinor: 0, MultiprocessorCount: 80, ClockRate: 1530000,
		MemoryClockRate: 877000, GlobalMemoryBusWidth: 4096, L2CacheSize: 6291456, AsyncEngineCount: 6,
		MaxSharedMemoryPerMultiprocessor: 98304, MaxSharedMemoryPerBlockOptin: 98304,
		ReservedSharedMemoryPerBlock: 0, MaxPersistingL2CacheSize: 0, MaxAccessPolicyWindowSize: 0,
		GenericCompressionSupported: 0, SparseCudaArraySupported: 0, DeferredMappingCudaArraySupported: 0,
		ClusterLaunch: 0, MemSyncDomainCount: 1, TensorMapAccessSupported: 0,
	})
}

func ampere() Table {
	return build(common, map[Attr]int32{
		ComputeCapabilityMajor: 8, ComputeCapabilityMinor: 0, MultiprocessorCount: 108, ClockRate: 1410000,
		MemoryClockRate: 1593000, GlobalMemoryBusWidth: 5120, L2CacheSize: 41943040, AsyncEngineCount: 3,
		MaxSharedMemoryPerMultiprocessor: 167936, MaxSharedMemoryPerBlockOptin: 166912,
		ReservedSharedMemoryPerBlock: 1024, MaxPersistingL2CacheSize: 31457280,
		MaxAccessPolicyWindowSize: 134217728, GenericCompressionSupported: 1, SparseCudaArraySupported: 1,
		DeferredMappingCudaArraySupported: 1, ClusterLaunch: 0, MemSyncDomainCount: 1,
		TensorMapAccessSupported: 0,
	})
}

func hopper() Table {
	return build(common, map[Attr]int32{
		ComputeCapabilityMajor: 9, ComputeCapabilityMinor: 0, MultiprocessorCount: 132, ClockRate: 1980000,
		MemoryClockRate: 2619000, GlobalMemoryBusWidth: 5120, L2CacheSize: 52428800, AsyncEngineCount: 3,
		MaxSharedMemoryPerMultiprocessor: 233472, MaxSharedMemoryPerBlockOptin: 232448,
		ReservedSharedMemoryPerBlock: 1024, MaxPersistingL2CacheSize: 32768000,
		MaxAccessPolicyWindowSize: 134217728, GenericCompressionSupported: 1, SparseCudaArraySupported: 1,
		DeferredMappingCudaArraySupported: 1, ClusterLaunch: 1, MemSyncDomainCount: 4,
		TensorMapAccessSupported: 1, HandleTypeFabricSupported: 1, UnifiedFunctionPointers: 1,
	})
}

func hopperH200() Table {
	t := hopper()
	t[MemoryClockRate] = 3201000
	t[GlobalMemoryBusWidth] = 6144
	return t
}
