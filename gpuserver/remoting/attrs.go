package remoting

import (
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// CUdevice_attribute values the shim answers locally from the hello reply.
const (
	attrMaxThreadsPerBlock        = 1
	attrMaxBlockDimX              = 2
	attrMaxBlockDimY              = 3
	attrMaxBlockDimZ              = 4
	attrMaxGridDimX               = 5
	attrMaxGridDimY               = 6
	attrMaxGridDimZ               = 7
	attrMaxSharedMemoryPerBlock   = 8
	attrTotalConstantMemory       = 9
	attrWarpSize                  = 10
	attrMaxPitch                  = 11
	attrMaxRegistersPerBlock      = 12
	attrClockRate                 = 13
	attrTextureAlignment          = 14
	attrMultiprocessorCount       = 16
	attrIntegrated                = 18
	attrCanMapHostMemory          = 19
	attrComputeMode               = 20
	attrConcurrentKernels         = 31
	attrECCEnabled                = 32
	attrPCIBusID                  = 33
	attrPCIDeviceID               = 34
	attrMemoryClockRate           = 36
	attrGlobalMemoryBusWidth      = 37
	attrL2CacheSize               = 38
	attrMaxThreadsPerSM           = 39
	attrAsyncEngineCount          = 40
	attrUnifiedAddressing         = 41
	attrComputeCapabilityMajor    = 75
	attrComputeCapabilityMinor    = 76
	attrMaxSharedMemoryPerSM      = 81
	attrMaxRegistersPerSM         = 82
	attrManagedMemory             = 83
	attrCooperativeLaunch         = 95
	attrMaxSharedMemoryPerBlockOp = 97
	attrVMMSupported              = 102
	attrMemoryPoolsSupported      = 115
)

// deviceReply is the device a function sees: one GPU of the node's model, with the function's quota as memory.
func (s *Server) deviceReply(spec pool.FunctionSpec) reply {
	info := device.GPUInfo{Name: "faas-gpu remoted GPU", ComputeCapability: 90}
	if s.cfg.Device != nil {
		if g := s.cfg.Device.GPUs(); len(g) > 0 {
			info = g[0]
		}
	}
	r := reply{status: wireStatusOK, totalMem: spec.MemoryBytes, deviceName: info.Name}
	copy(r.uuid[:], info.UUID)
	a := &r.attrs
	for k, v := range map[int]int32{
		attrMaxThreadsPerBlock: 1024, attrMaxBlockDimX: 1024, attrMaxBlockDimY: 1024, attrMaxBlockDimZ: 64,
		attrMaxGridDimX: 2147483647, attrMaxGridDimY: 65535, attrMaxGridDimZ: 65535,
		attrMaxSharedMemoryPerBlock: 49152, attrTotalConstantMemory: 65536, attrWarpSize: 32,
		attrMaxPitch: 2147483647, attrMaxRegistersPerBlock: 65536, attrClockRate: 1755000, attrTextureAlignment: 512,
		attrMultiprocessorCount: 132, attrCanMapHostMemory: 1, attrConcurrentKernels: 1, attrECCEnabled: 1,
		attrMemoryClockRate: 2619000, attrGlobalMemoryBusWidth: 5120, attrL2CacheSize: 52428800,
		attrMaxThreadsPerSM: 2048, attrAsyncEngineCount: 2, attrUnifiedAddressing: 1,
		attrComputeCapabilityMajor: int32(info.ComputeCapability / 10),
		attrComputeCapabilityMinor: int32(info.ComputeCapability % 10),
		attrMaxSharedMemoryPerSM:   233472, attrMaxRegistersPerSM: 65536, attrCooperativeLaunch: 1,
		attrMaxSharedMemoryPerBlockOp: 232448, attrVMMSupported: 1,
	} {
		a[k] = v
	}
	return r
}
