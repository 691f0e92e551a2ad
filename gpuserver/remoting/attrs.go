package remoting

import (
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// unprovided are the attributes of features a remoted function cannot use, whatever its GPU offers: its host
// memory is not mapped into the GPU (no mapped or registered host pointers in kernels, no managed or pageable
// memory access), nothing is shared with other processes (IPC handles, dma-buf, RDMA, multicast, external
// semaphores), and memory pools and host-located VMM allocations are not remoted. The shim reports them as 0 so
// that libraries take the paths that work.
var unprovided = []attrs.Attr{
	attrs.CanMapHostMemory, attrs.CanUseHostPointerForRegisteredMem, attrs.ManagedMemory,
	attrs.ConcurrentManagedAccess, attrs.PageableMemoryAccess, attrs.PageableMemoryAccessUsesHostPageTables,
	attrs.DirectManagedMemAccessFromHost, attrs.HostNativeAtomicSupported, attrs.OnlyPartialHostNativeAtomicSupported,
	attrs.HandleTypePosixFileDescriptorSupported, attrs.HandleTypeWin32HandleSupported,
	attrs.HandleTypeWin32KmtHandleSupported, attrs.HandleTypeFabricSupported, attrs.MempoolSupportedHandleTypes,
	attrs.IpcEventSupported, attrs.DmaBufSupported, attrs.HostAllocDmaBufSupported, attrs.GpuDirectRdmaSupported,
	attrs.GpuDirectRdmaWithCudaVmmSupported, attrs.GpuDirectRdmaFlushWritesOptions, attrs.MulticastSupported,
	attrs.TimelineSemaphoreInteropSupported, attrs.MemoryPoolsSupported, attrs.HostNumaVirtualMemoryManagementSupported,
	attrs.HostNumaMemoryPoolsSupported, attrs.HostNumaMultinodeIpcSupported, attrs.HostMemoryPoolsSupported,
	attrs.HostVirtualMemoryManagementSupported, attrs.MultiGpuBoard, attrs.MultiGpuBoardGroupId,
}

// deviceReply is the device a function sees: GPU 0 of the node (its name, UUID and complete attribute table, less
// the unprovided features), with the function's quota as memory.
func (s *Server) deviceReply(spec pool.FunctionSpec) reply {
	var info device.GPUInfo
	if s.cfg.Device != nil {
		if g := s.cfg.Device.GPUs(); len(g) > 0 {
			info = g[0]
		}
	}
	if info.Name == "" { // a transport-only server (NewHandler) without a device: a generic sm_90 GPU
		m, _ := attrs.ForModel("NVIDIA H100 80GB HBM3")
		info = device.GPUInfo{Name: "faas-gpu remoted GPU", Attributes: m.Table()}
	}
	r := reply{status: wireStatusOK, totalMem: spec.MemoryBytes, deviceName: info.Name}
	if u, err := device.ParseUUID(info.UUID); err == nil {
		r.uuid = u
	}
	t := info.Attributes
	for _, a := range unprovided {
		t[a] = 0
	}
	copy(r.attrs[:], t[:])
	return r
}
