package device

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

func TestPackArgsPlacesEachValueAtItsOffset(t *testing.T) {
	params := []Param{{Offset: 0, Size: 8}, {Offset: 8, Size: 8}, {Offset: 16, Size: 8}, {Offset: 24, Size: 8},
		{Offset: 32, Size: 4}, {Offset: 36, Size: 4}, {Offset: 40, Size: 4}}
	buf, err := PackArgs(params, Ptr(0x7f0000001000), uint64(1<<40), int64(-2), 2.5, uint32(7), int32(-3),
		float32(1.5))
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if got := le.Uint64(buf[0:]); got != 0x7f0000001000 {
		t.Errorf("Ptr = %#x", got)
	}
	if got := le.Uint64(buf[8:]); got != 1<<40 {
		t.Errorf("uint64 = %d", got)
	}
	if got := int64(le.Uint64(buf[16:])); got != -2 {
		t.Errorf("int64 = %d", got)
	}
	if got := math.Float64frombits(le.Uint64(buf[24:])); got != 2.5 {
		t.Errorf("float64 = %v", got)
	}
	if got := le.Uint32(buf[32:]); got != 7 {
		t.Errorf("uint32 = %d", got)
	}
	if got := int32(le.Uint32(buf[36:])); got != -3 {
		t.Errorf("int32 = %d", got)
	}
	if got := math.Float32frombits(le.Uint32(buf[40:])); got != 1.5 {
		t.Errorf("float32 = %v", got)
	}
}

func TestPackArgsRefusesMismatches(t *testing.T) {
	p8 := []Param{{Offset: 0, Size: 8}}
	for name, tc := range map[string]struct {
		params []Param
		values []any
	}{
		"count":            {p8, []any{uint64(1), uint64(2)}},
		"size":             {p8, []any{uint32(1)}},
		"unsupported type": {p8, []any{"eight"}},
	} {
		if _, err := PackArgs(tc.params, tc.values...); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("%s: err = %v, want ErrInvalidValue", name, err)
		}
	}
}
