package sim

import (
	"encoding/binary"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
)

var _ device.ExtendedLauncher = (*stream)(nil)

// LaunchEx checks the launch attributes as the driver does and launches like Launch; a completion or
// programmatic event is recorded after the kernel (the simulated GPU runs one kernel at a time, so a dependent
// launch may start exactly when the kernel ends).
func (s *stream) LaunchEx(f device.Function, grid, block device.Dim3, sharedMem uint32, la []device.LaunchAttribute,
	args []byte) error {
	info := s.b.gpus[s.gpu]
	g := norm(grid)
	var events []device.Event
	for _, a := range la {
		switch a.ID {
		case device.LaunchAttrClusterDimension, device.LaunchAttrPreferredClusterDimension:
			c := device.Dim3{X: binary.LittleEndian.Uint32(a.Value[0:]), Y: binary.LittleEndian.Uint32(a.Value[4:]),
				Z: binary.LittleEndian.Uint32(a.Value[8:])}
			if info.Attributes.Get(attrs.ClusterLaunch) == 0 {
				return fmt.Errorf("%w: thread block clusters need compute capability 9.0 (gpu %d has %d)",
					device.ErrNotSupported, s.gpu, info.ComputeCapability)
			}
			if c.X == 0 || c.Y == 0 || c.Z == 0 || g.X%c.X != 0 || g.Y%c.Y != 0 || g.Z%c.Z != 0 {
				return fmt.Errorf("%w: cluster %dx%dx%d does not divide grid %dx%dx%d", device.ErrInvalidValue, c.X,
					c.Y, c.Z, g.X, g.Y, g.Z)
			}
			if c.X*c.Y*c.Z > 16 {
				return fmt.Errorf("%w: cluster of %d blocks (at most 16)", device.ErrInvalidValue, c.X*c.Y*c.Z)
			}
		case device.LaunchAttrProgrammaticEvent, device.LaunchAttrLaunchCompletionEvent:
			if a.Event == nil {
				return fmt.Errorf("%w: launch attribute %d without an event", device.ErrInvalidValue, a.ID)
			}
			events = append(events, a.Event)
		case device.LaunchAttrIgnore, device.LaunchAttrAccessPolicyWindow, device.LaunchAttrCooperative,
			device.LaunchAttrSynchronizationPolicy, device.LaunchAttrClusterSchedulingPolicyPreference,
			device.LaunchAttrProgrammaticStreamSerialization, device.LaunchAttrPriority,
			device.LaunchAttrMemSyncDomainMap, device.LaunchAttrMemSyncDomain,
			device.LaunchAttrDeviceUpdatableKernelNode, device.LaunchAttrPreferredSharedMemoryCarveout,
			device.LaunchAttrNvlinkUtilCentricScheduling:
		default:
			return fmt.Errorf("%w: unknown launch attribute %d", device.ErrInvalidValue, a.ID)
		}
	}
	if err := s.Launch(f, grid, block, sharedMem, args); err != nil {
		return err
	}
	for _, e := range events {
		if err := s.Record(e); err != nil {
			return err
		}
	}
	return nil
}
