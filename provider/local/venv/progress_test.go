package venv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeClock advances by step on every reading.
type fakeClock struct {
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time { c.t = c.t.Add(c.step); return c.t }

// TestProgressFilterOnPipsOutput feeds pip's real output (pip 23.2 downloading a 16.3 MB wheel with its progress bar
// on and FORCE_COLOR=1, recorded in testdata) through the filter in small pieces: the bar's refreshes become plain
// lines naming the file with bytes and percent, every other line passes unchanged, and no escape sequence or bar
// character is left.
func TestProgressFilterOnPipsOutput(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "pip-download-progress.raw"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	clock := &fakeClock{t: time.Unix(0, 0), step: 2 * time.Second}
	f := newProgressFilter(&out, 5*time.Second, clock.now)
	for len(raw) > 0 { // in pieces that split lines and escape sequences
		n := min(7, len(raw))
		if _, err := f.Write(raw[:n]); err != nil {
			t.Fatal(err)
		}
		raw = raw[n:]
	}
	f.Flush()
	text := out.String()
	const whl = "numpy-2.1.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
	for _, want := range []string{
		"Collecting numpy==2.1.3\n",
		"  Downloading " + whl + " (16.3 MB)\n",
		"Downloading " + whl + ": 3.3/16.3 MB (20%), 113.0 MB/s, eta 0:00:01\n",
		"Downloading " + whl + ": 16.3/16.3 MB (100%), 142.5 MB/s\n",
		"Successfully downloaded numpy\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the filtered output lacks %q:\n%s", want, text)
		}
	}
	if strings.ContainsAny(text, "\x1b\r━╸╺") || strings.Contains(text, "0.0/16.3") {
		t.Errorf("escape sequences, carriage returns, bar characters or the empty first frame are left:\n%q", text)
	}
}

// TestProgressFilterThrottles: a long download refreshed many times a second gives a line every 10% or every
// interval, and its end; a short one gives its end only.
func TestProgressFilterThrottles(t *testing.T) {
	var out bytes.Buffer
	clock := &fakeClock{t: time.Unix(0, 0), step: 100 * time.Millisecond}
	f := newProgressFilter(&out, 5*time.Second, clock.now)
	fmt.Fprint(f, "  Downloading big.whl (531.0 MB)\n")
	for mb := 1; mb <= 531; mb++ { // 531 refreshes, 0.1 s apart
		fmt.Fprintf(f, "\x1b[2K   \x1b[91m━━━━╸\x1b[0m %d.0/531.0 MB \x1b[31m10.0 MB/s\x1b[0m eta 0:00:%02d\r", mb, (531-mb)%60)
	}
	fmt.Fprint(f, "\n  Downloading small.whl (12.0 kB)\n")
	fmt.Fprint(f, "   ━━━━━━━ 0.0/12.0 kB ? eta -:--:--\r\x1b[2K   ━━━━━━━ 12.0/12.0 kB 1.0 MB/s eta 0:00:00\n")
	f.Flush()
	var big, small []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		switch {
		case strings.HasPrefix(l, "Downloading big.whl: "):
			big = append(big, l)
		case strings.HasPrefix(l, "Downloading small.whl: "):
			small = append(small, l)
		}
	}
	// 53 s of download: every 10% (about 5.3 s apart) or every 5 s, whichever comes first: 10 to 12 lines.
	if len(big) < 10 || len(big) > 12 || !strings.HasSuffix(big[len(big)-1], "531.0/531.0 MB (100%), 10.0 MB/s") {
		t.Errorf("a 53 s download gave %d progress lines, want 10 to 12 ending at 100%%:\n%s", len(big),
			strings.Join(big, "\n"))
	}
	if len(small) != 1 || small[0] != "Downloading small.whl: 12.0/12.0 kB (100%), 1.0 MB/s" {
		t.Errorf("a short download gave %q, want its end only", small)
	}
}

// TestInstallErrorNamesTheNetwork: offline, pip's error says only "Could not find a version that satisfies the
// requirement"; the install's error then says that pip could not reach the package index, with pip's first
// network error, so that the deploy's status and the function's answer name the cause.
func TestInstallErrorNamesTheNetwork(t *testing.T) {
	offline := "Collecting torch==2.9.1\n" +
		"WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection " +
		"broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: Failed to " +
		"establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/torch/\n" +
		"ERROR: Could not find a version that satisfies the requirement torch==2.9.1 (from versions: none)\n" +
		"ERROR: No matching distribution found for torch==2.9.1\n"
	w := &tailWriter{}
	_, _ = w.Write([]byte(offline))
	got := w.summary()
	for _, want := range []string{"pip could not reach the package index (no network to PyPI?",
		"No matching distribution found for torch==2.9.1", "Temporary failure in name resolution"} {
		if !strings.Contains(got, want) {
			t.Errorf("offline install error lacks %q: %s", want, got)
		}
	}
	w = &tailWriter{}
	_, _ = w.Write([]byte("ERROR: Could not find a version that satisfies the requirement nosuchpkg==1 (from versions: 0.1)\n"))
	if got := w.summary(); strings.Contains(got, "network") || !strings.Contains(got, "nosuchpkg") {
		t.Errorf("an online install error: %s", got)
	}
}
