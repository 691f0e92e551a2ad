package sim

import (
	"sort"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

var _ device.EnumerableModule = (*module)(nil)

// FunctionNames lists the module's kernels (cuLibraryEnumerateKernels), sorted by name.
func (m *module) FunctionNames() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.funcs))
	for n := range m.funcs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
