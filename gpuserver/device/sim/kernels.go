package sim

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// launch is one kernel launch's configuration and arguments.
type launch struct {
	grid, block device.Dim3
	args        []byte
	params      []device.Param
}

func (l launch) threadsX() uint64 { return uint64(l.grid.X) * uint64(l.block.X) }
func (l launch) threadsY() uint64 { return uint64(l.grid.Y) * uint64(l.block.Y) }
func (l launch) threadsZ() uint64 { return uint64(l.grid.Z) * uint64(l.block.Z) }

// threads is the launch's thread count, saturated at the largest uint64.
func (l launch) threads() uint64 { return mulSat(mulSat(l.threadsX(), l.threadsY()), l.threadsZ()) }

// mulSat multiplies, saturating at the largest uint64 instead of wrapping.
func mulSat(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}

func (l launch) ptr(i int) device.Ptr {
	return device.Ptr(binary.LittleEndian.Uint64(l.args[l.params[i].Offset:]))
}
func (l launch) u32(i int) uint32 { return binary.LittleEndian.Uint32(l.args[l.params[i].Offset:]) }
func (l launch) f32(i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(l.args[l.params[i].Offset:]))
}

// kernelFunc runs a reference kernel and returns the device memory bytes it moved and its float operations. It
// checks every device range it reads or writes (mapped, with access) before it allocates host memory for any.
type kernelFunc func(b *Backend, gpu int, l launch) (bytes uint64, flops float64, err error)

// workFunc is the number of element operations a launch of a reference kernel does (saturated), known from its
// configuration and arguments before it runs: the sim refuses a launch above Options.MaxKernelOps.
type workFunc func(l launch) uint64

// kernelTime is the GPU time of a reference kernel whose time is its argument rather than its work.
type kernelTime func(l launch) time.Duration

// refKernel is a reference kernel: its parameter sizes (in order), its Go implementation and its work.
type refKernel struct {
	sizes []uint32
	run   kernelFunc
	work  workFunc
	time  kernelTime // set for busy: the launch takes this long
}

// layout is the reference kernel's parameter layout: each parameter at the next multiple of its size.
func (k refKernel) layout() []device.Param {
	var out []device.Param
	var off uint32
	for _, s := range k.sizes {
		off = (off + s - 1) / s * s
		out = append(out, device.Param{Offset: off, Size: s})
		off += s
	}
	return out
}

// referenceList names the reference kernels, for messages.
const referenceList = "vector_add, matmul, linear, relu, fill, scale, busy and set_<global>"

// referenceKernel returns the reference kernel called name.
func referenceKernel(name string) (refKernel, bool) {
	switch name {
	case "vector_add":
		return refKernel{[]uint32{8, 8, 8, 4}, vectorAdd, elementsAt(3), nil}, true
	case "matmul":
		return refKernel{[]uint32{8, 8, 8, 4, 4, 4}, matmul, gemmWork(3), nil}, true
	case "linear":
		return refKernel{[]uint32{8, 8, 8, 8, 4, 4, 4}, linear, gemmWork(4), nil}, true
	case "relu":
		return refKernel{[]uint32{8, 8, 4}, relu, elementsAt(2), nil}, true
	case "fill":
		return refKernel{[]uint32{8, 4, 4}, fill, elementsAt(2), nil}, true
	case "scale":
		return refKernel{[]uint32{8, 4, 4}, scale, elementsAt(2), nil}, true
	case "busy":
		return refKernel{[]uint32{8}, busy, func(launch) uint64 { return 0 }, busyTime}, true
	}
	return refKernel{}, false
}

// elementsAt is the work of an elementwise kernel whose element count is parameter i: that count, at most one
// element per thread.
func elementsAt(i int) workFunc {
	return func(l launch) uint64 { return min(uint64(l.u32(i)), l.threads()) }
}

// gemmWork is the work of a matrix product whose m, n, k are parameters i, i+1, i+2: m x n x k multiply-adds
// over the rows and columns the grid covers.
func gemmWork(i int) workFunc {
	return func(l launch) uint64 {
		rows, cols := min(uint64(l.u32(i)), l.threadsY()), min(uint64(l.u32(i+1)), l.threadsX())
		return mulSat(mulSat(rows, cols), uint64(l.u32(i+2)))
	}
}

// reference applies the matching rule of the package documentation to a kernel of the module: it returns the Go
// implementation the sim computes the kernel with, its work and (for busy) its time, or nil and, for a kernel
// named like a reference kernel, why it is not one.
func (m *module) reference(k kernelDecl) (kernelFunc, workFunc, kernelTime, string) {
	if ref, ok := referenceKernel(k.name); ok {
		if want := ref.layout(); !slices.Equal(k.params, want) {
			return nil, nil, nil, fmt.Sprintf("its parameters %v are not the reference kernel's %v", k.params, want)
		}
		return ref.run, ref.work, ref.time, ""
	}
	name, ok := strings.CutPrefix(k.name, "set_")
	if !ok {
		return nil, nil, nil, ""
	}
	g, ok := m.globals[name]
	switch {
	case !ok:
		return nil, nil, nil, fmt.Sprintf("the module has no global %q for it to set", name)
	case len(k.params) != 1 || uint64(k.params[0].Size) != g.size || g.size == 0:
		return nil, nil, nil, fmt.Sprintf("it must have one parameter as large as the global %s (%d bytes), not %v",
			name, g.size, k.params)
	}
	p := k.params[0]
	return func(b *Backend, gpu int, l launch) (uint64, float64, error) {
		return uint64(p.Size), 0, b.writeDevice(gpu, g.ptr, l.args[p.Offset:p.Offset+p.Size])
	}, func(launch) uint64 { return uint64(p.Size) }, nil, ""
}

// checkF32 checks that gpu may touch count float32 values at p (mapped, with access) without touching them, so
// that a kernel allocates host memory only for ranges that exist; a count whose byte size overflows is an illegal
// address too.
func (b *Backend) checkF32(gpu int, p device.Ptr, count uint64) error {
	if count > math.MaxUint64/4 {
		return fmt.Errorf("%w: %d float32 values at %#x", device.ErrIllegalAddress, count, uint64(p))
	}
	return b.resolveChecked(gpu, p, 4*count)
}

func (b *Backend) readF32(gpu int, p device.Ptr, n uint64) ([]float32, error) {
	buf := make([]byte, 4*n)
	if err := b.readDevice(gpu, buf, p); err != nil {
		return nil, err
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return out, nil
}

func (b *Backend) writeF32(gpu int, p device.Ptr, v []float32) error {
	buf := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
	}
	return b.writeDevice(gpu, p, buf)
}

// elementwise reads the inputs at ins, applies f per element and writes the result to out, for the first
// min(n, threads) elements.
func elementwise(b *Backend, gpu int, l launch, n uint64, ins []device.Ptr, out device.Ptr,
	f func(i int, in [][]float32) float32) (uint64, float64, error) {
	n = min(n, l.threads())
	if n == 0 {
		return 0, 0, nil
	}
	for _, p := range append(ins, out) {
		if err := b.checkF32(gpu, p, n); err != nil {
			return 0, 0, err
		}
	}
	in := make([][]float32, len(ins))
	for i, p := range ins {
		v, err := b.readF32(gpu, p, n)
		if err != nil {
			return 0, 0, err
		}
		in[i] = v
	}
	res := make([]float32, n)
	for i := range res {
		res[i] = f(i, in)
	}
	if err := b.writeF32(gpu, out, res); err != nil {
		return 0, 0, err
	}
	return 4 * n * uint64(len(ins)+1), float64(n), nil
}

func vectorAdd(b *Backend, gpu int, l launch) (uint64, float64, error) {
	return elementwise(b, gpu, l, uint64(l.u32(3)), []device.Ptr{l.ptr(0), l.ptr(1)}, l.ptr(2),
		func(i int, in [][]float32) float32 { return in[0][i] + in[1][i] })
}

func relu(b *Backend, gpu int, l launch) (uint64, float64, error) {
	return elementwise(b, gpu, l, uint64(l.u32(2)), []device.Ptr{l.ptr(0)}, l.ptr(1),
		func(i int, in [][]float32) float32 { return max(in[0][i], 0) })
}

func fill(b *Backend, gpu int, l launch) (uint64, float64, error) {
	v := l.f32(1)
	return elementwise(b, gpu, l, uint64(l.u32(2)), nil, l.ptr(0),
		func(int, [][]float32) float32 { return v })
}

func scale(b *Backend, gpu int, l launch) (uint64, float64, error) {
	alpha := l.f32(1)
	return elementwise(b, gpu, l, uint64(l.u32(2)), []device.Ptr{l.ptr(0)}, l.ptr(0),
		func(i int, in [][]float32) float32 { return alpha * in[0][i] })
}

// busy changes no memory; its GPU time is its argument (busyTime).
func busy(*Backend, int, launch) (uint64, float64, error) { return 0, 0, nil }

// busyTime is busy's argument, in nanoseconds (at most an hour).
func busyTime(l launch) time.Duration {
	return time.Duration(min(binary.LittleEndian.Uint64(l.args[l.params[0].Offset:]), uint64(time.Hour)))
}

func matmul(b *Backend, gpu int, l launch) (uint64, float64, error) {
	return gemm(b, gpu, l, l.ptr(0), l.ptr(1), 0, l.ptr(2), l.u32(3), l.u32(4), l.u32(5))
}

func linear(b *Backend, gpu int, l launch) (uint64, float64, error) {
	return gemm(b, gpu, l, l.ptr(0), l.ptr(1), l.ptr(2), l.ptr(3), l.u32(4), l.u32(5), l.u32(6))
}

// gemm computes c = a b (+ bias when bias != 0) for the rows and columns the grid covers; other elements of c
// keep their value.
func gemm(b *Backend, gpu int, l launch, pa, pb, pbias, pc device.Ptr, m32, n32, k32 uint32) (uint64, float64,
	error) {
	m, n, k := uint64(m32), uint64(n32), uint64(k32)
	rows, cols := min(m, l.threadsY()), min(n, l.threadsX())
	if rows == 0 || cols == 0 {
		return 0, 0, nil
	}
	// Every range before any memory for it: sizes come from the launch's arguments (products of two 32-bit
	// values, checked for overflow), and what they cover must be mapped for this GPU.
	ranges := []struct {
		p     device.Ptr
		count uint64
	}{{pa, mulSat(rows, k)}, {pb, mulSat(k, n)}, {pc, mulSat(rows, n)}}
	if pbias != 0 {
		ranges = append(ranges, struct {
			p     device.Ptr
			count uint64
		}{pbias, n})
	}
	for _, r := range ranges {
		if err := b.checkF32(gpu, r.p, r.count); err != nil {
			return 0, 0, err
		}
	}
	a, err := b.readF32(gpu, pa, rows*k)
	if err != nil {
		return 0, 0, err
	}
	w, err := b.readF32(gpu, pb, k*n)
	if err != nil {
		return 0, 0, err
	}
	bias := make([]float32, n)
	if pbias != 0 {
		if bias, err = b.readF32(gpu, pbias, n); err != nil {
			return 0, 0, err
		}
	}
	c, err := b.readF32(gpu, pc, rows*n)
	if err != nil {
		return 0, 0, err
	}
	acc := make([]float32, n)
	for i := range rows {
		copy(acc, bias)
		for kk := range k {
			av := a[i*k+kk]
			row := w[kk*n : kk*n+n]
			for j := range cols {
				acc[j] = float32(math.FMA(float64(av), float64(row[j]), float64(acc[j])))
			}
		}
		copy(c[i*n:i*n+cols], acc[:cols])
	}
	if err := b.writeF32(gpu, pc, c); err != nil {
		return 0, 0, err
	}
	return 4 * (rows*k + k*n + n + rows*n), 2 * float64(rows*cols*k), nil
}
