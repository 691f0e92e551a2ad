package fatbin

import (
	"errors"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// unzstd decodes Zstandard frames into size bytes at most: the decoder refuses frames that declare or produce more
// (WithDecodeAllCapLimit), so a hostile payload cannot make it allocate beyond size. The window may be larger than
// a small frame's content (1 KiB at least), hence the separate bound on memory.
func unzstd(src []byte, size uint64) ([]byte, error) {
	if size == 0 {
		return nil, errors.New("zstd payload with an uncompressed size of 0")
	}
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(max(size, 1<<20)), zstd.WithDecodeAllCapLimit(true))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	out, err := d.DecodeAll(src, make([]byte, 0, size))
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	return out, nil
}

// unlz4 decodes an LZ4 block (the format of nvcc --compress-mode=speed) into at most size bytes.
//
// A block is a run of sequences: a token byte (high nibble: literal length, low nibble: match length - 4), the
// literal length's extension bytes when the nibble is 15 (each adds up to 255, the last one is below 255), the
// literals, then - except after the last sequence - a little-endian u16 offset back into the output and the
// match length's extension bytes when its nibble is 15. A match may overlap the bytes it produces.
func unlz4(src []byte, size uint64) ([]byte, error) {
	out := make([]byte, 0, size)
	i := 0
	for i < len(src) {
		token := src[i]
		i++
		lit, err := lz4Length(src, &i, int(token>>4))
		if err != nil {
			return nil, err
		}
		if lit > len(src)-i {
			return nil, fmt.Errorf("lz4: %d literals at offset %d overrun the block", lit, i)
		}
		if uint64(lit) > size-uint64(len(out)) {
			return nil, fmt.Errorf("lz4: output exceeds %d bytes", size)
		}
		out = append(out, src[i:i+lit]...)
		i += lit
		if i == len(src) {
			break // the last sequence has literals only
		}
		if len(src)-i < 2 {
			return nil, fmt.Errorf("lz4: truncated match offset at %d", i)
		}
		back := int(src[i]) | int(src[i+1])<<8
		i += 2
		if back == 0 || back > len(out) {
			return nil, fmt.Errorf("lz4: match offset %d with %d bytes decoded", back, len(out))
		}
		n, err := lz4Length(src, &i, int(token&0xf))
		if err != nil {
			return nil, err
		}
		n += 4
		if uint64(n) > size-uint64(len(out)) {
			return nil, fmt.Errorf("lz4: output exceeds %d bytes", size)
		}
		start := len(out) - back
		for k := range n { // byte by byte: the match may overlap what it writes
			out = append(out, out[start+k])
		}
	}
	return out, nil
}

// lz4Length reads the extension bytes of a length whose nibble is 15.
func lz4Length(src []byte, i *int, n int) (int, error) {
	if n != 15 {
		return n, nil
	}
	for {
		if *i >= len(src) {
			return 0, errors.New("lz4: truncated length")
		}
		b := src[*i]
		*i++
		n += int(b)
		if n > 1<<31 {
			return 0, errors.New("lz4: length overflow")
		}
		if b != 255 {
			return n, nil
		}
	}
}
