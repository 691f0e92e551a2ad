package handoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"syscall"
)

// ErrClosed: the control socket ended (the other process exited, was killed, or closed it); calls in flight fail
// with it.
var ErrClosed = errors.New("tenant control socket closed")

// Handler answers a request frame: the reply's body and the descriptors to send with it (the Peer closes them once
// sent), or an error sent as an Error reply. The handler owns the request's descriptors.
type Handler func(ctx context.Context, f Frame) (body any, files []*os.File, err error)

// Peer is one side of a control socket: it sends requests and waits for their replies (Call), sends one-way
// frames (Notify), and runs the handlers of the requests the other side sends, each in a goroutine of its own.
type Peer struct {
	c        *net.UnixConn
	handlers map[Kind]Handler
	codes    []Code
	log      *slog.Logger

	wmu sync.Mutex // one frame at a time on the socket

	mu     sync.Mutex
	next   uint64
	calls  map[uint64]chan Frame
	err    error // why the peer ended
	done   chan struct{}
	closed bool
	wg     sync.WaitGroup // running handlers
}

// Code names a sentinel error on the wire, so that errors.Is holds on both sides of the socket.
type Code struct {
	Name string
	Err  error
}

// NewPeer wraps c; handlers answer the other side's requests by kind (a kind without a handler is answered with
// an error), codes name the sentinel errors that travel.
func NewPeer(c *net.UnixConn, handlers map[Kind]Handler, codes []Code, log *slog.Logger) *Peer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Peer{c: c, handlers: handlers, codes: codes, log: log, calls: map[uint64]chan Frame{},
		done: make(chan struct{})}
}

// Serve reads frames until the socket ends or ctx does, then fails the calls in flight with ErrClosed, waits for
// the running handlers and returns why it ended.
func (p *Peer) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = p.c.Close() })
	defer stop()
	buf := make([]byte, HeaderSize+MaxBody)
	oob := make([]byte, syscall.CmsgSpace(4*MaxFiles))
	var err error
	for {
		var f Frame
		if f, err = read(p.c, buf, oob); err != nil {
			if errors.Is(err, ErrProtocol) {
				p.log.Error("tenant control: refused frame", "err", err)
				continue
			}
			break
		}
		switch {
		case f.Flags&FlagReply != 0:
			p.mu.Lock()
			ch := p.calls[f.ID]
			delete(p.calls, f.ID)
			p.mu.Unlock()
			if ch == nil {
				closeFiles(f.Files) // a reply nobody waits for (its call gave up)
				continue
			}
			ch <- f
		default:
			h := p.handlers[f.Kind]
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.dispatch(ctx, f, h)
			}()
		}
	}
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	p.mu.Lock()
	p.closed = true
	p.err = fmt.Errorf("%w: %w", ErrClosed, err)
	for id, ch := range p.calls {
		close(ch)
		delete(p.calls, id)
	}
	p.mu.Unlock()
	_ = p.c.Close()
	p.wg.Wait()
	close(p.done)
	return p.err
}

// dispatch runs a request's handler and sends its reply (none for a one-way frame, ID 0). A panicking handler is
// answered with an error: a bad request never ends the process.
func (p *Peer) dispatch(ctx context.Context, f Frame, h Handler) {
	var (
		body  any
		files []*os.File
		err   error
	)
	func() {
		defer func() {
			if r := recover(); r != nil {
				p.log.Error("tenant control: handler panicked", "kind", f.Kind, "panic", fmt.Sprint(r),
					"stack", string(debug.Stack()))
				err = fmt.Errorf("%w: handler of kind %d panicked: %v", ErrProtocol, f.Kind, r)
			}
		}()
		if h == nil {
			closeFiles(f.Files)
			err = fmt.Errorf("%w: no handler for kind %d", ErrProtocol, f.Kind)
			return
		}
		body, files, err = h(ctx, f)
	}()
	defer closeFiles(files)
	if f.ID == 0 {
		if err != nil {
			p.log.Warn("tenant control: one-way frame failed", "kind", f.Kind, "err", err)
		}
		return
	}
	flags := FlagReply
	if err != nil {
		flags |= FlagError
		body, files = p.encodeError(err), nil
	}
	b, eerr := Encode(f.Kind, flags, f.ID, body)
	if eerr != nil {
		b, _ = Encode(f.Kind, FlagReply|FlagError, f.ID, p.encodeError(eerr))
		files = nil
	}
	if werr := p.send(b, files); werr != nil && !errors.Is(werr, net.ErrClosed) {
		p.log.Warn("tenant control: reply", "kind", f.Kind, "err", werr)
	}
}

func (p *Peer) send(b []byte, files []*os.File) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return write(p.c, b, files)
}

// Call sends a request (with files, which stay the caller's) and waits for its reply, whose body is decoded into
// resp (when not nil) and whose descriptors are returned (the caller's to close). An error reply is returned as
// an error wrapping the sentinels its codes name.
func (p *Peer) Call(ctx context.Context, kind Kind, req any, files []*os.File, resp any) ([]*os.File, error) {
	ch := make(chan Frame, 1)
	p.mu.Lock()
	if p.closed {
		err := p.err
		p.mu.Unlock()
		return nil, err
	}
	p.next++
	id := p.next
	p.calls[id] = ch
	p.mu.Unlock()
	forget := func() {
		p.mu.Lock()
		delete(p.calls, id)
		p.mu.Unlock()
	}
	b, err := Encode(kind, 0, id, req)
	if err != nil {
		forget()
		return nil, err
	}
	if err := p.send(b, files); err != nil {
		forget()
		return nil, fmt.Errorf("%w: send: %w", ErrClosed, err)
	}
	var f Frame
	var ok bool
	select {
	case f, ok = <-ch:
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	}
	if !ok {
		p.mu.Lock()
		err := p.err
		p.mu.Unlock()
		return nil, err
	}
	if f.Flags&FlagError != 0 {
		closeFiles(f.Files)
		var e Error
		if err := json.Unmarshal(f.Body, &e); err != nil {
			return nil, fmt.Errorf("%w: error reply: %w", ErrProtocol, err)
		}
		return nil, p.decodeError(e)
	}
	if resp != nil {
		if err := json.Unmarshal(f.Body, resp); err != nil {
			closeFiles(f.Files)
			return nil, fmt.Errorf("%w: reply to kind %d: %w", ErrProtocol, kind, err)
		}
	}
	return f.Files, nil
}

// Notify sends a one-way frame (no reply; files stay the caller's).
func (p *Peer) Notify(kind Kind, body any, files []*os.File) error {
	b, err := Encode(kind, 0, 0, body)
	if err != nil {
		return err
	}
	return p.send(b, files)
}

// Done is closed when Serve has ended.
func (p *Peer) Done() <-chan struct{} { return p.done }

// Err is why the peer ended (nil while it serves).
func (p *Peer) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close ends the socket; Serve returns.
func (p *Peer) Close() error { return p.c.Close() }

// RemoteError is an error the other side answered: its message, and the sentinels its codes named.
type RemoteError struct {
	Message string
	Errs    []error
}

func (e *RemoteError) Error() string   { return e.Message }
func (e *RemoteError) Unwrap() []error { return e.Errs }

func (p *Peer) encodeError(err error) Error {
	var names []string
	for _, c := range p.codes {
		if errors.Is(err, c.Err) {
			names = append(names, c.Name)
		}
	}
	return Error{Codes: names, Message: err.Error()}
}

// DecodeError makes an error of an Error body (as a reply's, or one carried inside a body).
func (p *Peer) DecodeError(e Error) error { return p.decodeError(e) }

// EncodeError makes an Error body of err.
func (p *Peer) EncodeError(err error) Error { return p.encodeError(err) }

func (p *Peer) decodeError(e Error) error {
	re := &RemoteError{Message: e.Message}
	for _, n := range e.Codes {
		for _, c := range p.codes {
			if c.Name == n {
				re.Errs = append(re.Errs, c.Err)
			}
		}
	}
	return re
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// Decode of a request's body for a handler.
func Body[T any](f Frame) (T, error) {
	var v T
	if err := json.Unmarshal(f.Body, &v); err != nil {
		return v, fmt.Errorf("%w: kind %d: %w", ErrProtocol, f.Kind, err)
	}
	return v, nil
}
