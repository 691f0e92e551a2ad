package device

import (
	"encoding/binary"
	"fmt"
	"math"
)

// PackArgs builds a kernel argument buffer for params from values in declaration order. Each value is a Ptr,
// uint64, int64, uint32, int32, float32 or float64 and must match its parameter's size.
func PackArgs(params []Param, values ...any) ([]byte, error) {
	if len(values) != len(params) {
		return nil, fmt.Errorf("%w: %d arguments for %d parameters", ErrInvalidValue, len(values), len(params))
	}
	buf := make([]byte, ArgsSize(params))
	for i, v := range values {
		p := params[i]
		dst := buf[p.Offset : p.Offset+p.Size]
		var size uint32
		var bits uint64
		switch x := v.(type) {
		case Ptr:
			size, bits = 8, uint64(x)
		case uint64:
			size, bits = 8, x
		case int64:
			size, bits = 8, uint64(x)
		case float64:
			size, bits = 8, math.Float64bits(x)
		case uint32:
			size, bits = 4, uint64(x)
		case int32:
			size, bits = 4, uint64(uint32(x))
		case float32:
			size, bits = 4, uint64(math.Float32bits(x))
		default:
			return nil, fmt.Errorf("%w: argument %d has unsupported type %T", ErrInvalidValue, i, v)
		}
		if p.Size != size {
			return nil, fmt.Errorf("%w: argument %d is %d bytes, parameter is %d", ErrInvalidValue, i, size, p.Size)
		}
		if size == 8 {
			binary.LittleEndian.PutUint64(dst, bits)
		} else {
			binary.LittleEndian.PutUint32(dst, uint32(bits))
		}
	}
	return buf, nil
}
