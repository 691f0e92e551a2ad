package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Mode says whether the caller of a remoted call waits for its result.
type Mode string

// Modes of a remoted call.
const (
	ModeSync  Mode = "sync"
	ModeAsync Mode = "async"
)

// Arg is one argument of a remoted call.
type Arg struct {
	Name string
	Dir  string // "in" or "out"
	// Optional: an out argument the caller may pass as NULL (written as out? in the table): its value is read
	// from the response and dropped.
	Optional bool
	Type     string // i32 u32 u64 size handle f32 bytes str
	Len      string // for bytes: the length expression (an argument, a constant, or arg*const)
}

// Call is one remoted call of the API table.
type Call struct {
	ID        int
	Name      string
	Mode      Mode
	Args      []Arg
	Custom    bool
	Syncpoint bool
	Line      int
}

// API is the parsed API table.
type API struct {
	Calls   []Call
	Local   []string    // symbols with a handwritten entry point
	Entries []Entry     // every driver API function and its versioned symbols
	Aliases [][2]string // {symbol, target}: symbol shares target's implementation
}

var callRE = regexp.MustCompile(`^(sync|async)\s+(\d+)\s+([A-Za-z_][A-Za-z0-9_]*)\((.*)\)\s*(.*)$`)
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Parse reads an API table; errors name the line.
func Parse(r io.Reader) (*API, error) {
	api := &API{}
	ids := map[int]string{}
	names := map[string]int{}
	custom := map[string]bool{} // remoted calls with a handwritten entry point, listed again as local
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		switch f := strings.Fields(line); f[0] {
		case "local":
			for _, name := range f[1:] {
				if !identRE.MatchString(name) {
					return nil, fmt.Errorf("line %d: bad name %q", n, name)
				}
				if prev, ok := names[name]; ok && !custom[name] {
					return nil, fmt.Errorf("line %d: %s already declared on line %d", n, name, prev)
				}
				names[name] = n
				api.Local = append(api.Local, name)
			}
			continue
		case "entry":
			e, err := parseEntry(f[1:], n)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			api.Entries = append(api.Entries, e)
			continue
		case "alias":
			if len(f) != 3 || !identRE.MatchString(f[1]) || !identRE.MatchString(f[2]) {
				return nil, fmt.Errorf("line %d: want alias <symbol> <implemented symbol>", n)
			}
			api.Aliases = append(api.Aliases, [2]string{f[1], f[2]})
			continue
		}
		m := callRE.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %d: cannot parse %q", n, line)
		}
		id, _ := strconv.Atoi(m[2])
		if id <= 0 || id > 65535 {
			return nil, fmt.Errorf("line %d: id %d out of range 1..65535", n, id)
		}
		if prev, ok := ids[id]; ok {
			return nil, fmt.Errorf("line %d: id %d already used by %s", n, id, prev)
		}
		if prev, ok := names[m[3]]; ok {
			return nil, fmt.Errorf("line %d: %s already declared on line %d", n, m[3], prev)
		}
		ids[id] = m[3]
		names[m[3]] = n
		c := Call{ID: id, Name: m[3], Mode: Mode(m[1]), Line: n}
		for _, fl := range strings.Fields(m[5]) {
			switch fl {
			case "custom":
				c.Custom = true
			case "syncpoint":
				c.Syncpoint = true
			default:
				return nil, fmt.Errorf("line %d: unknown flag %q", n, fl)
			}
		}
		if strings.TrimSpace(m[4]) != "" {
			for _, a := range strings.Split(m[4], ",") {
				arg, err := parseArg(strings.TrimSpace(a))
				if err != nil {
					return nil, fmt.Errorf("line %d: %s: %w", n, c.Name, err)
				}
				c.Args = append(c.Args, arg)
			}
		}
		if err := c.check(); err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n, c.Name, err)
		}
		api.Calls = append(api.Calls, c)
		custom[c.Name] = c.Custom
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := api.checkSymbols(); err != nil {
		return nil, err
	}
	return api, nil
}

// checkSymbols checks that the symbols are unique and that every exported implementation and alias names a
// symbol of an entry, so that each one is reachable by cuGetProcAddress.
func (api *API) checkSymbols() error {
	line := map[string]int{}
	for _, e := range api.Entries {
		for _, v := range e.Variants {
			if prev, ok := line[v.Symbol]; ok {
				return fmt.Errorf("line %d: symbol %s already comes from line %d", e.Line, v.Symbol, prev)
			}
			line[v.Symbol] = e.Line
		}
	}
	if len(api.Entries) == 0 {
		return nil // a table of calls only (tests of the parser)
	}
	for _, c := range api.Calls {
		if _, ok := line[c.Name]; !ok && !c.Custom {
			return fmt.Errorf("line %d: %s is not a symbol of any entry (a wire-only call must be custom)", c.Line, c.Name)
		}
	}
	impl := api.implemented()
	for _, l := range api.Local {
		if _, ok := line[l]; !ok {
			return fmt.Errorf("local %s is not a symbol of any entry", l)
		}
	}
	for _, a := range api.Aliases {
		if _, ok := line[a[0]]; !ok {
			return fmt.Errorf("alias %s is not a symbol of any entry", a[0])
		}
		if !impl[a[1]] {
			return fmt.Errorf("alias %s: %s is not implemented", a[0], a[1])
		}
		if impl[a[0]] {
			return fmt.Errorf("alias %s: already implemented", a[0])
		}
	}
	return nil
}

// implemented is the set of symbols with an entry point of their own (generated or handwritten).
func (api *API) implemented() map[string]bool {
	impl := map[string]bool{}
	for _, c := range api.Calls {
		if !c.Custom {
			impl[c.Name] = true
		}
	}
	for _, l := range api.Local {
		impl[l] = true
	}
	return impl
}

// Targets maps every exported symbol to the symbol whose implementation it uses: itself when implemented, the
// alias target, the plain variant's for an unimplemented per-thread variant of an implemented (or aliased)
// function, or "" for a stub.
func (api *API) Targets() map[string]string {
	impl := api.implemented()
	t := map[string]string{}
	for s := range impl {
		t[s] = s
	}
	for _, a := range api.Aliases {
		t[a[0]] = a[1]
	}
	for _, e := range api.Entries {
		for _, v := range e.Variants {
			if _, ok := t[v.Symbol]; ok {
				continue
			}
			if plain := strings.TrimSuffix(v.Symbol, v.PT); v.PT != "" && t[plain] != "" {
				t[v.Symbol] = t[plain]
				continue
			}
			t[v.Symbol] = ""
		}
	}
	return t
}

var bytesRE = regexp.MustCompile(`^bytes\[([A-Za-z0-9_*]+)\]$`)

func parseArg(s string) (Arg, error) {
	f := strings.Fields(s)
	a := Arg{Dir: "in"}
	if len(f) == 3 {
		switch f[0] {
		case "in", "out":
			a.Dir = f[0]
		case "out?":
			a.Dir, a.Optional = "out", true
		default:
			return a, fmt.Errorf("bad direction %q in %q", f[0], s)
		}
		f = f[1:]
	}
	if len(f) != 2 || !identRE.MatchString(f[1]) {
		return a, fmt.Errorf("bad argument %q", s)
	}
	a.Name = f[1]
	switch t := f[0]; t {
	case "i32", "u32", "u64", "size", "handle", "f32", "str":
		a.Type = t
	default:
		m := bytesRE.FindStringSubmatch(t)
		if m == nil {
			return a, fmt.Errorf("bad type %q", t)
		}
		a.Type, a.Len = "bytes", m[1]
	}
	if a.Optional && a.Type == "bytes" {
		return a, fmt.Errorf("optional out bytes are not supported: %q", s)
	}
	if a.Type == "f32" && a.Dir != "out" {
		return a, fmt.Errorf("f32 is out only: %q", s)
	}
	if a.Type == "str" && a.Dir != "in" {
		return a, fmt.Errorf("str is in only: %q", s)
	}
	return a, nil
}

func (c *Call) check() error {
	seen := map[string]bool{}
	for _, a := range c.Args {
		if seen[a.Name] {
			return fmt.Errorf("argument %s repeated", a.Name)
		}
		seen[a.Name] = true
		if c.Mode == ModeAsync && a.Dir == "out" {
			return fmt.Errorf("async call has an out argument %s", a.Name)
		}
	}
	for _, a := range c.Args {
		if a.Type != "bytes" {
			continue
		}
		name, _, err := c.splitLen(a.Len)
		if err != nil {
			return err
		}
		if name != "" {
			la := c.arg(name)
			if la == nil || la.Dir != "in" || la.Type == "bytes" || la.Type == "str" || la.Type == "handle" {
				return fmt.Errorf("length %s of %s must name an in scalar argument", a.Len, a.Name)
			}
		}
	}
	return nil
}

func (c *Call) arg(name string) *Arg {
	for i := range c.Args {
		if c.Args[i].Name == name {
			return &c.Args[i]
		}
	}
	return nil
}

// splitLen splits a length expression into an argument name (may be empty) and a constant factor.
func (c *Call) splitLen(l string) (name string, k uint64, err error) {
	parts := strings.Split(l, "*")
	switch len(parts) {
	case 1:
		if v, err := strconv.ParseUint(parts[0], 10, 32); err == nil {
			return "", v, nil
		}
		return parts[0], 1, nil
	case 2:
		v, err := strconv.ParseUint(parts[1], 10, 32)
		if err != nil {
			return "", 0, fmt.Errorf("bad length %q", l)
		}
		return parts[0], v, nil
	}
	return "", 0, fmt.Errorf("bad length %q", l)
}

func (c *Call) hasOut() bool {
	for _, a := range c.Args {
		if a.Dir == "out" {
			return true
		}
	}
	return false
}
