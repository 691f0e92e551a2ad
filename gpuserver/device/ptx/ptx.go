// Package ptx reads the kernel entries of PTX text: each `.entry` (or `.visible .entry`) name and its parameter
// layout in the argument buffer, laid out as the CUDA driver lays out kernel parameters (each parameter aligned to
// its own alignment, in declaration order). The sim backend uses it to recognise reference kernels; the cuda
// backend uses it where the driver cannot report parameter layouts (before CUDA 12.4's cuFuncGetParamInfo).
package ptx

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// ErrSyntax is wrapped by errors about PTX that cannot be read.
var ErrSyntax = errors.New("ptx syntax")

// Entry is one kernel of a PTX module.
type Entry struct {
	// Name is the kernel's symbol name (mangled, or as declared for extern "C").
	Name string
	// Params in declaration order.
	Params []device.Param
	// ParamTypes are the PTX types of the parameters (".u64", ".f32", ".b8" ...).
	ParamTypes []string
}

// IsPTX reports whether image looks like PTX text (rather than a cubin or fatbin).
func IsPTX(image []byte) bool {
	head := image[:min(len(image), 4096)]
	return bytes.Contains(head, []byte(".version")) || bytes.Contains(head, []byte(".entry"))
}

var (
	entryRe = regexp.MustCompile(`\.entry\s+([A-Za-z_$%][A-Za-z0-9_$%]*)\s*\(`)
	paramRe = regexp.MustCompile(`^\.param\s+(?:\.align\s+(\d+)\s+)?(\.[a-z]+[0-9]*)\s+` +
		`(?:\.ptr(?:\s+\.(?:global|shared|const|local))*(?:\s+\.align\s+\d+)?\s+)?` +
		`([A-Za-z_$%][A-Za-z0-9_$%]*)\s*(?:\[(\d+)\])?$`)
)

// Entries returns the kernel entries of PTX text in the order they appear.
func Entries(src []byte) ([]Entry, error) {
	text := stripComments(string(src))
	var out []Entry
	for _, loc := range entryRe.FindAllStringSubmatchIndex(text, -1) {
		name := text[loc[2]:loc[3]]
		rest := text[loc[1]:]
		end := strings.IndexByte(rest, ')')
		if end < 0 {
			return nil, fmt.Errorf("%w: entry %s: parameter list not closed", ErrSyntax, name)
		}
		e := Entry{Name: name}
		var off uint32
		list := strings.TrimSpace(rest[:end])
		if list != "" {
			for i, decl := range strings.Split(list, ",") {
				decl = strings.Join(strings.Fields(decl), " ")
				m := paramRe.FindStringSubmatch(decl)
				if m == nil {
					return nil, fmt.Errorf("%w: entry %s: parameter %d: cannot read %q", ErrSyntax, name, i, decl)
				}
				elem, err := typeSize(m[2])
				if err != nil {
					return nil, fmt.Errorf("%w: entry %s: parameter %d: %w", ErrSyntax, name, i, err)
				}
				size, align := elem, elem
				if m[4] != "" {
					n, _ := strconv.ParseUint(m[4], 10, 32)
					size = elem * uint32(n)
				}
				if m[1] != "" {
					a, _ := strconv.ParseUint(m[1], 10, 32)
					align = uint32(a)
				}
				if align == 0 || align&(align-1) != 0 {
					return nil, fmt.Errorf("%w: entry %s: parameter %d: alignment %d", ErrSyntax, name, i, align)
				}
				off = (off + align - 1) &^ (align - 1)
				e.Params = append(e.Params, device.Param{Offset: off, Size: size})
				e.ParamTypes = append(e.ParamTypes, m[2])
				off += size
			}
		}
		out = append(out, e)
	}
	return out, nil
}

func typeSize(t string) (uint32, error) {
	switch t {
	case ".b8", ".u8", ".s8":
		return 1, nil
	case ".b16", ".u16", ".s16", ".f16", ".bf16":
		return 2, nil
	case ".b32", ".u32", ".s32", ".f32":
		return 4, nil
	case ".b64", ".u64", ".s64", ".f64":
		return 8, nil
	}
	return 0, fmt.Errorf("unknown parameter type %s", t)
}

func stripComments(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "//"):
			j := strings.IndexByte(s[i:], '\n')
			if j < 0 {
				return b.String()
			}
			i += j
		case strings.HasPrefix(s[i:], "/*"):
			j := strings.Index(s[i+2:], "*/")
			if j < 0 {
				return b.String()
			}
			i += j + 4
		default:
			b.WriteByte(s[i])
			i++
		}
	}
	return b.String()
}
