package local

import (
	"bytes"
	"context"
	"encoding/json"

	"fmt"
	"os"
	"sync"
	"time"

	"github.com/openfaas/faas-provider/logs"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// maxLogFile is the size at which a function's log file is rotated to <file>.1.
const maxLogFile = 8 << 20

// logbook keeps a function's recent output in a bounded ring, appends every line to a file and wakes followers.
type logbook struct {
	mu      sync.Mutex
	ring    []logs.Message
	next    int    // ring index of the next append
	seq     uint64 // lines appended so far; line i (0-based) has sequence number i+1
	changed chan struct{}
	closed  bool
	path    string
	file    *os.File
	size    int64
	fileErr error // first error writing the file; the ring keeps working
}

func newLogbook(lines int, path string) *logbook {
	l := &logbook{ring: make([]logs.Message, 0, lines), changed: make(chan struct{}), path: path}
	l.reload()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		l.fileErr = err
	} else {
		l.file = f
		if st, err := f.Stat(); err == nil {
			l.size = st.Size()
		}
	}
	return l
}

// reload fills the ring with the last lines of the log file a previous run left, so that a restarted backend
// still shows a function's recent output. Lines that do not parse are skipped.
func (l *logbook) reload() {
	data, err := os.ReadFile(l.path)
	if err != nil {
		return
	}
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > cap(l.ring)+1 {
		lines = lines[len(lines)-cap(l.ring)-1:]
	}
	for _, line := range lines {
		var m logs.Message
		if len(line) == 0 || json.Unmarshal(line, &m) != nil {
			continue
		}
		if len(l.ring) < cap(l.ring) {
			l.ring = append(l.ring, m)
		} else {
			l.ring[l.next] = m
		}
		l.next = (l.next + 1) % cap(l.ring)
		l.seq++
	}
}

// append records one line.
func (l *logbook) append(m logs.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if len(l.ring) < cap(l.ring) {
		l.ring = append(l.ring, m)
	} else {
		l.ring[l.next] = m
	}
	l.next = (l.next + 1) % cap(l.ring)
	l.seq++
	close(l.changed)
	l.changed = make(chan struct{})
	l.writeFile(m)
}

func (l *logbook) writeFile(m logs.Message) {
	if l.file == nil {
		return
	}
	line, err := json.Marshal(m)
	if err != nil {
		return
	}
	line = append(line, '\n')
	if l.size+int64(len(line)) > maxLogFile {
		_ = l.file.Close()
		_ = os.Rename(l.path, l.path+".1")
		f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			l.file, l.fileErr = nil, err
			return
		}
		l.file, l.size = f, 0
	}
	n, err := l.file.Write(line)
	l.size += int64(n)
	if err != nil && l.fileErr == nil {
		l.fileErr = err
	}
}

// since returns the lines with a sequence number above after (as many as the ring still holds), the current
// sequence number, a channel closed at the next append, and whether the logbook is closed.
func (l *logbook) since(after uint64) ([]logs.Message, uint64, <-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.seq - after
	if n > uint64(len(l.ring)) {
		n = uint64(len(l.ring))
	}
	out := make([]logs.Message, 0, n)
	total := len(l.ring)
	oldest := 0
	if total == cap(l.ring) {
		oldest = l.next
	}
	for i := total - int(n); i < total; i++ {
		out = append(out, l.ring[(oldest+i)%total])
	}
	return out, l.seq, l.changed, l.closed
}

// close wakes followers for the last time and closes the file.
func (l *logbook) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.changed)
	if l.file != nil {
		_ = l.file.Close()
		l.file = nil
	}
}

// lineWriter turns a child's output stream into log lines.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(text string)
}

const maxLine = 64 << 10

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			if len(w.buf) >= maxLine {
				w.emit(string(w.buf))
				w.buf = w.buf[:0]
			}
			return len(p), nil
		}
		w.emit(string(bytes.TrimRight(w.buf[:i], "\r")))
		w.buf = w.buf[i+1:]
	}
}

// flush emits a last line that had no newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emit(string(w.buf))
		w.buf = nil
	}
}

// Logs returns a function's output as faas-provider log messages: the lines still held in memory (at most
// Config.LogLines), filtered by req.Since and req.Instance and limited to the last req.Tail; with req.Follow, new
// lines follow until ctx ends or the function is deleted.
func (b *Backend) Logs(ctx context.Context, req logs.Request) (<-chan logs.Message, error) {
	if err := names.Function("name", req.Name); err != nil {
		return nil, err
	}
	ns, err := b.namespace(req.Namespace)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClosed
	}
	fn, ok := b.fns[fnKey(ns, req.Name)]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: function %q in namespace %s", provider.ErrNotFound, req.Name, ns)
	}
	keep := func(m logs.Message) bool {
		return (req.Since == nil || !m.Timestamp.Before(*req.Since)) && (req.Instance == "" || m.Instance == req.Instance)
	}
	all, seq, changed, closed := fn.logs.since(0)
	history := all[:0:0]
	for _, m := range all {
		if keep(m) {
			history = append(history, m)
		}
	}
	if req.Tail > 0 && len(history) > req.Tail {
		history = history[len(history)-req.Tail:]
	}
	if !req.Follow {
		ch := make(chan logs.Message, len(history))
		for _, m := range history {
			ch <- m
		}
		close(ch)
		return ch, nil
	}
	ch := make(chan logs.Message)
	go func() {
		defer close(ch)
		send := func(msgs []logs.Message) bool {
			for _, m := range msgs {
				if !keep(m) {
					continue
				}
				select {
				case ch <- m:
				case <-ctx.Done():
					return false
				}
			}
			return true
		}
		if !send(history) {
			return
		}
		for !closed {
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
			var msgs []logs.Message
			msgs, seq, changed, closed = fn.logs.since(seq)
			if !send(msgs) {
				return
			}
		}
	}()
	return ch, nil
}

// event records something the backend did to a replica in the function's log, so that `faas-cli logs` shows why a
// function restarted.
func (fn *function) event(instance, format string, args ...any) {
	fn.logs.append(logs.Message{Name: fn.name, Namespace: fn.ns, Instance: instance,
		Timestamp: time.Now().UTC(), Text: "faas-gpu: " + fmt.Sprintf(format, args...)})
}
