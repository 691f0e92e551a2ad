package venv

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// pip shows a download's progress (bytes, percent, speed) only on a terminal; without one a 531 MB wheel downloads
// for a minute without a line. So pip runs with its progress bar on and FORCE_COLOR=1, which makes its console
// (rich) render the bar as it would on a terminal: one line per refresh, ended by a carriage return and wrapped in
// escape sequences. progressFilter turns that back into plain lines: escape sequences go, carriage returns end
// lines, and the bar's refreshes (dozens a second) become a line now and then that says what is downloading, how
// much of it, the percentage, the speed and the time left:
//
//	Downloading torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl: 123.4/531.0 MB (23%), 10.2 MB/s, eta 0:00:40
//
// Every other line of pip's output passes unchanged.
type progressFilter struct {
	out      io.Writer
	interval time.Duration // at most one progress line per interval, besides every 10% and the end
	now      func() time.Time

	mu      sync.Mutex
	buf     []byte
	file    string    // what the last "Downloading" line named
	lastPct int       // percentage of the last progress line written (0 when the download began)
	lastAt  time.Time // when it was written (when the download began)
}

// pipProgressEnv makes pip's console render its progress bar without a terminal (rich reads FORCE_COLOR) at a width
// that holds the bar and its figures on one line.
var pipProgressEnv = []string{"FORCE_COLOR=1", "COLUMNS=120", "TERM=xterm"}

// progressInterval is how often a long download says how far it got, besides every 10%.
const progressInterval = 5 * time.Second

func newProgressFilter(out io.Writer, interval time.Duration, now func() time.Time) *progressFilter {
	return &progressFilter{out: out, interval: interval, now: now}
}

var (
	// escapes are the terminal's control sequences: CSI (colours, cursor, erase line) and OSC (titles, links).
	escapes = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]`)
	// barLine is a refresh of the download bar: the bar, done/total and unit, the speed, the time left.
	barLine = regexp.MustCompile(`^[\s━╸╺╾╼─-]*([0-9.]+)/([0-9.]+) ([kMGT]?B) (.*?) eta (\S+)$`)
	// downloading is pip's line that names the file whose download follows.
	downloading = regexp.MustCompile(`^\s*Downloading (\S+)`)
)

func (f *progressFilter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.buf = append(f.buf, p...)
	for {
		i := strings.IndexAny(string(f.buf), "\r\n")
		if i < 0 {
			if len(f.buf) > 64<<10 { // a line without an end: pass it on rather than hold it
				f.line(string(f.buf))
				f.buf = f.buf[:0]
			}
			return len(p), nil
		}
		line := string(f.buf[:i])
		f.buf = f.buf[i+1:]
		f.line(line)
	}
}

// Flush writes what is left of a last line without an end.
func (f *progressFilter) Flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.buf) > 0 {
		f.line(string(f.buf))
		f.buf = nil
	}
}

// line handles one line (the mutex is held).
func (f *progressFilter) line(raw string) {
	text := strings.TrimRight(escapes.ReplaceAllString(raw, ""), " \t")
	if strings.TrimSpace(text) == "" {
		return
	}
	m := barLine.FindStringSubmatch(text)
	if m == nil {
		if d := downloading.FindStringSubmatch(text); d != nil {
			f.file, f.lastPct, f.lastAt = d[1], 0, f.now()
		}
		fmt.Fprintln(f.out, text)
		return
	}
	done, err1 := strconv.ParseFloat(m[1], 64)
	total, err2 := strconv.ParseFloat(m[2], 64)
	if err1 != nil || err2 != nil || total <= 0 || done <= 0 {
		return // the bar's first frame (nothing yet) says nothing
	}
	pct := int(100 * done / total)
	now := f.now()
	if m[1] == m[2] { // the end
		pct = 100
	}
	if pct <= f.lastPct || pct < 100 && pct < f.lastPct+10 && now.Sub(f.lastAt) < f.interval {
		return
	}
	name := f.file
	if name == "" {
		name = "a file"
	}
	speed := strings.TrimSpace(m[4])
	figures := fmt.Sprintf("%s/%s %s (%d%%)", m[1], m[2], m[3], pct)
	if speed != "" && speed != "?" {
		figures += ", " + speed
	}
	if pct < 100 && m[5] != "-:--:--" {
		figures += ", eta " + m[5]
	}
	fmt.Fprintf(f.out, "Downloading %s: %s\n", name, figures)
	f.lastPct, f.lastAt = pct, now
}
