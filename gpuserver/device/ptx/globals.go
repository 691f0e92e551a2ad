package ptx

import (
	"encoding/binary"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Global is a module-scope variable of PTX text in the global or constant state space (a __device__,
// __constant__ or __managed__ variable): what cuModuleGetGlobal finds by name.
type Global struct {
	Name string
	// Const is true for the constant state space (__constant__).
	Const bool
	// Managed is true for .attribute(.managed) variables.
	Managed bool
	// Size and Align in bytes.
	Size, Align uint64
	// Init holds the initial bytes of the first len(Init) <= Size bytes, those the initialiser lists; the others
	// are zero (nil: no initialiser).
	Init []byte
	// Relocs are initialiser elements that are addresses of other variables.
	Relocs []Reloc
}

// Reloc is an address in an initialiser: Size bytes at Offset hold the address of Symbol plus Addend.
type Reloc struct {
	Offset uint64
	Size   int
	Symbol string
	Addend int64
}

// maxGlobalBytes bounds one variable's declared size.
const maxGlobalBytes = 1 << 40

var (
	globalDeclRe = regexp.MustCompile(`^((?:\.(?:visible|weak|extern|common)\s+)*)\.(global|const)\s+(.*)$`)
	attrRe       = regexp.MustCompile(`^\.attribute\s*\(\s*([^)]*)\)\s*`)
	alignRe      = regexp.MustCompile(`^\.align\s+(\d+)\s*`)
	vecRe        = regexp.MustCompile(`^\.v(2|4|8)\s+`)
	typeRe       = regexp.MustCompile(`^\.([a-z]+[0-9]*)\s+`)
	nameRe       = regexp.MustCompile(`^([A-Za-z_$%][A-Za-z0-9_$%]*)\s*`)
	dimRe        = regexp.MustCompile(`^\[\s*(\d*)\s*\]\s*`)
	addrRe       = regexp.MustCompile(`^(?:generic\(\s*([A-Za-z_$%][A-Za-z0-9_$%]*)\s*\)|([A-Za-z_$%][A-Za-z0-9_$%]*))` +
		`\s*(?:\+\s*(-?\d+))?$`)
)

// Globals returns the module-scope variables of the global and constant state spaces, in the order they appear,
// with their initial bytes: integer, float (0f/0d bit patterns or decimal) and address elements (`sym`,
// `generic(sym)`, optionally `+ offset`, which become Relocs) in scalar or brace-list initialisers, row-major for
// arrays. Declarations with .extern own no storage and are left out, and so are opaque types (.texref ...).
func Globals(src []byte) ([]Global, error) {
	var out []Global
	for _, stmt := range moduleStatements(stripComments(string(src))) {
		m := globalDeclRe.FindStringSubmatch(stmt)
		if m == nil || strings.Contains(m[1], ".extern") {
			continue
		}
		g, ok, err := parseGlobal(m[2] == "const", m[3])
		if err != nil {
			return nil, fmt.Errorf("%w: %.80s: %w", ErrSyntax, stmt, err)
		}
		if ok {
			out = append(out, g)
		}
	}
	return out, nil
}

// lineDirectives are the module directives that end at the end of their line rather than at ';'.
var lineDirectives = []string{".version", ".target", ".address_size", ".file", ".loc", ".section"}

// moduleStatements splits PTX into its module-scope statements (up to ';'), leaving out function bodies and the
// directives of lineDirectives.
func moduleStatements(text string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(text); i++ {
		c := text[i]
		if strings.TrimSpace(cur.String()) == "" && c == '.' {
			for _, d := range lineDirectives {
				if strings.HasPrefix(text[i:], d) {
					if j := strings.IndexByte(text[i:], '\n'); j >= 0 {
						i += j
					} else {
						i = len(text)
					}
					cur.Reset()
					c = 0
					break
				}
			}
			if c == 0 {
				continue
			}
		}
		switch {
		case c == ';':
			out = append(out, strings.Join(strings.Fields(cur.String()), " "))
			cur.Reset()
		case c == '{' && !strings.Contains(cur.String(), "="): // a function body: skip it
			depth := 0
			for ; i < len(text); i++ {
				if text[i] == '{' {
					depth++
				} else if text[i] == '}' {
					if depth--; depth == 0 {
						break
					}
				}
			}
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return out
}

func parseGlobal(isConst bool, rest string) (Global, bool, error) {
	g := Global{Const: isConst}
	rest = strings.TrimSpace(rest)
	if m := attrRe.FindStringSubmatch(rest); m != nil {
		g.Managed = strings.Contains(m[1], ".managed")
		rest = rest[len(m[0]):]
	}
	var align uint64
	if m := alignRe.FindStringSubmatch(rest); m != nil {
		a, err := strconv.ParseUint(m[1], 10, 32)
		if err != nil || a == 0 || a&(a-1) != 0 {
			return g, false, fmt.Errorf("alignment %s", m[1])
		}
		align, rest = a, rest[len(m[0]):]
	}
	vec := uint64(1)
	if m := vecRe.FindStringSubmatch(rest); m != nil {
		vec, _ = strconv.ParseUint(m[1], 10, 8)
		rest = rest[len(m[0]):]
	}
	m := typeRe.FindStringSubmatch(rest)
	if m == nil {
		return g, false, fmt.Errorf("no type")
	}
	typ := "." + m[1]
	if typ == ".texref" || typ == ".samplerref" || typ == ".surfref" {
		return g, false, nil
	}
	size32, err := typeSize(typ)
	if err != nil {
		return g, false, err
	}
	elem := uint64(size32)
	rest = rest[len(m[0]):]
	if m = nameRe.FindStringSubmatch(rest); m == nil {
		return g, false, fmt.Errorf("no name")
	}
	g.Name, rest = m[1], rest[len(m[0]):]
	var dims []uint64
	open := false // an unsized first dimension: [] = {...}
	for {
		m := dimRe.FindStringSubmatch(rest)
		if m == nil {
			break
		}
		if m[1] == "" {
			if len(dims) > 0 {
				return g, false, fmt.Errorf("only the first dimension may be unsized")
			}
			open = true
			dims = append(dims, 0)
		} else {
			n, err := strconv.ParseUint(m[1], 10, 40)
			if err != nil {
				return g, false, fmt.Errorf("dimension %s", m[1])
			}
			dims = append(dims, n)
		}
		rest = rest[len(m[0]):]
	}
	var elems []string
	if rest = strings.TrimSpace(rest); rest != "" {
		init, ok := strings.CutPrefix(rest, "=")
		if !ok {
			return g, false, fmt.Errorf("unexpected %q", rest)
		}
		for _, e := range strings.Split(strings.NewReplacer("{", ",", "}", ",").Replace(init), ",") {
			if e = strings.TrimSpace(e); e != "" {
				elems = append(elems, e)
			}
		}
	}
	row := elem * vec // bytes per element of the first dimension
	for _, d := range dims[min(1, len(dims)):] {
		if d != 0 && row > maxGlobalBytes/d {
			return g, false, fmt.Errorf("larger than %d bytes", uint64(maxGlobalBytes))
		}
		row *= d
	}
	switch {
	case len(dims) == 0:
		g.Size = row
	case open:
		slots := row / elem
		if slots == 0 {
			return g, false, fmt.Errorf("empty dimension")
		}
		g.Size = (uint64(len(elems)) + slots - 1) / slots * row
	default:
		if dims[0] != 0 && row > maxGlobalBytes/dims[0] {
			return g, false, fmt.Errorf("larger than %d bytes", uint64(maxGlobalBytes))
		}
		g.Size = row * dims[0]
	}
	g.Align = max(align, elem)
	if uint64(len(elems)) > g.Size/elem {
		return g, false, fmt.Errorf("%d initialisers for %d elements", len(elems), g.Size/elem)
	}
	if len(elems) == 0 {
		return g, true, nil
	}
	g.Init = make([]byte, uint64(len(elems))*elem) // bounded by the text, however large the variable
	float := strings.HasPrefix(typ, ".f")
	for i, e := range elems {
		off := uint64(i) * elem
		if m := addrRe.FindStringSubmatch(e); m != nil && (elem == 4 || elem == 8) {
			sym := m[1] + m[2]
			addend, _ := strconv.ParseInt(m[3], 10, 64)
			g.Relocs = append(g.Relocs, Reloc{Offset: off, Size: int(elem), Symbol: sym, Addend: addend})
			continue
		}
		bits, err := literal(e, float, elem)
		if err != nil {
			return g, false, fmt.Errorf("initialiser %d: %w", i, err)
		}
		switch elem {
		case 1:
			g.Init[off] = byte(bits)
		case 2:
			binary.LittleEndian.PutUint16(g.Init[off:], uint16(bits))
		case 4:
			binary.LittleEndian.PutUint32(g.Init[off:], uint32(bits))
		case 8:
			binary.LittleEndian.PutUint64(g.Init[off:], bits)
		}
	}
	return g, true, nil
}

// literal returns the bits of a PTX integer or floating-point constant for an element of size bytes.
func literal(s string, float bool, size uint64) (uint64, error) {
	switch {
	case len(s) == 10 && (strings.HasPrefix(s, "0f") || strings.HasPrefix(s, "0F")):
		return strconv.ParseUint(s[2:], 16, 32)
	case len(s) == 18 && (strings.HasPrefix(s, "0d") || strings.HasPrefix(s, "0D")):
		return strconv.ParseUint(s[2:], 16, 64)
	}
	t := strings.TrimSuffix(strings.TrimSuffix(s, "U"), "u")
	if v, err := strconv.ParseInt(t, 0, 64); err == nil {
		if float {
			return floatBits(float64(v), size), nil
		}
		return uint64(v), nil
	}
	if v, err := strconv.ParseUint(t, 0, 64); err == nil && !float {
		return v, nil
	}
	if v, err := strconv.ParseFloat(s, 64); err == nil && float {
		return floatBits(v, size), nil
	}
	return 0, fmt.Errorf("cannot read %q", s)
}

func floatBits(v float64, size uint64) uint64 {
	if size == 4 {
		return uint64(math.Float32bits(float32(v)))
	}
	if size == 8 {
		return math.Float64bits(v)
	}
	return 0 // .f16 initialisers are written as bit patterns (integers) by nvcc
}
