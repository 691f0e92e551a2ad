// Package client calls a gpuserver's API (package api) over its Unix socket or TCP. Errors wrap the pool's
// sentinels (pool.ErrUnknownFunction, ...) and auth's (auth.ErrUnauthenticated, auth.ErrForbidden) so callers test
// them with errors.Is, whichever side of the socket they came from.
//
// A binding is a lease of the connection that acquired it (package api): Acquire opens a connection of its own
// for each binding and keeps it until Release, so the gpuserver releases the binding should this process die.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// ErrUnavailable: the gpuserver could not be reached or answered with a server error.
var ErrUnavailable = errors.New("gpuserver unavailable")

// Client talks to one gpuserver.
type Client struct {
	base  string
	http  *http.Client
	dial  func(ctx context.Context) (net.Conn, error)
	token string

	mu     sync.Mutex
	leases map[string]*leaseConn // binding id -> the connection that acquired it
}

// leaseConn is the connection that holds one binding.
type leaseConn struct {
	conn net.Conn
	br   *bufio.Reader
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends token as the bearer credential of every call: the administrator's token (the provider) or a
// function's own (FAAS_GPU_TOKEN).
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// New returns a client for the gpuserver listening on the Unix socket at socketPath.
func New(socketPath string, opts ...Option) *Client {
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socketPath)
	}
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	return newClient("http://gpuserver", &http.Client{Transport: tr}, dial, opts)
}

// NewTCP returns a client for a gpuserver at baseURL, e.g. http://127.0.0.1:8090.
func NewTCP(baseURL string, opts ...Option) *Client {
	base := strings.TrimRight(baseURL, "/")
	dial := func(ctx context.Context) (net.Conn, error) {
		u, err := url.Parse(base)
		if err != nil {
			return nil, err
		}
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "80")
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", host)
	}
	return newClient(base, &http.Client{}, dial, opts)
}

func newClient(base string, hc *http.Client, dial func(context.Context) (net.Conn, error), opts []Option) *Client {
	c := &Client{base: base, http: hc, dial: dial, leases: map[string]*leaseConn{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Register adds or updates a GPU function. It satisfies provider.GPURegistry.
func (c *Client) Register(ctx context.Context, spec pool.FunctionSpec) error {
	return c.do(ctx, http.MethodPost, "/v1/functions", spec, nil)
}

// RegisterToken registers spec like Register and returns the function's token (FAAS_GPU_TOKEN of its processes).
func (c *Client) RegisterToken(ctx context.Context, spec pool.FunctionSpec) (string, error) {
	var resp struct {
		Token string `json:"token"`
	}
	err := c.do(ctx, http.MethodPost, "/v1/functions", spec, &resp)
	return resp.Token, err
}

// Deregister removes a GPU function; an unknown name is not an error.
func (c *Client) Deregister(ctx context.Context, name string) error {
	err := c.do(ctx, http.MethodDelete, "/v1/functions/"+url.PathEscape(name), nil, nil)
	if errors.Is(err, pool.ErrUnknownFunction) {
		return nil
	}
	return err
}

// Acquire waits for a binding of function to a GPU, for at most timeout (0: the server's default). The binding
// is held on a connection of its own until Release (or until this process ends).
func (c *Client) Acquire(ctx context.Context, function string, timeout time.Duration) (pool.Binding, error) {
	return c.AcquireInstance(ctx, function, "", timeout)
}

// AcquireInstance is Acquire for one instance of function (a replica's process: pool.InstanceKey); a function's
// instances are bound concurrently, each on a GPU of its own, one request at a time.
func (c *Client) AcquireInstance(ctx context.Context, function, instance string, timeout time.Duration) (pool.Binding,
	error) {
	var b pool.Binding
	body := map[string]any{}
	if timeout > 0 {
		body["timeout_ms"] = max(1, timeout.Milliseconds())
	}
	if instance != "" {
		body["instance"] = instance
	}
	path := "/v1/functions/" + url.PathEscape(function) + "/acquire"
	conn, err := c.dial(ctx)
	if err != nil {
		return b, fmt.Errorf("%w: POST %s: %w", ErrUnavailable, path, err)
	}
	lc := &leaseConn{conn: conn, br: bufio.NewReader(conn)}
	if err := c.roundTrip(ctx, lc, http.MethodPost, path, body, &b); err != nil {
		conn.Close()
		return pool.Binding{}, err
	}
	c.mu.Lock()
	c.leases[b.ID] = lc
	c.mu.Unlock()
	return b, nil
}

// Release ends a binding, on the connection that acquired it when this client did.
func (c *Client) Release(ctx context.Context, bindingID string) error {
	path := "/v1/bindings/" + url.PathEscape(bindingID) + "/release"
	c.mu.Lock()
	lc := c.leases[bindingID]
	delete(c.leases, bindingID)
	c.mu.Unlock()
	if lc == nil {
		return c.do(ctx, http.MethodPost, path, nil, nil)
	}
	defer lc.conn.Close()
	return c.roundTrip(ctx, lc, http.MethodPost, path, nil, nil)
}

// roundTrip sends one request on a lease's own connection and reads its answer.
func (c *Client) roundTrip(ctx context.Context, lc *leaseConn, method, path string, in, out any) error {
	req, err := c.request(ctx, method, path, in)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = lc.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := req.Write(lc.conn); err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, errors.Join(ctx.Err(), err))
	}
	resp, err := http.ReadResponse(lc.br, req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, errors.Join(ctx.Err(), err))
	}
	defer resp.Body.Close()
	return answer(resp, method, path, out)
}

// Status returns the pool's snapshot.
func (c *Client) Status(ctx context.Context) (pool.Status, error) {
	var st pool.Status
	err := c.do(ctx, http.MethodGet, "/v1/pool", nil, &st)
	return st, err
}

func (c *Client) request(ctx context.Context, method, path string, in any) (*http.Request, error) {
	var body io.Reader
	if in != nil {
		buf, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	req, err := c.request(ctx, method, path, in)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, err)
	}
	defer resp.Body.Close()
	return answer(resp, method, path, out)
}

// answer turns a response into the decoded out value or an error wrapping the sentinel of its status.
func answer(resp *http.Response, method, path string, out any) error {
	if resp.StatusCode >= 300 {
		var e struct {
			Error   string `json:"error"`
			Restart bool   `json:"restart"`
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(raw))
		}
		// 429 with Retry-After: the overload control sheds the function (without: a limit, pool.ErrLimit).
		if ra := resp.Header.Get("Retry-After"); resp.StatusCode == http.StatusTooManyRequests && ra != "" {
			after, _ := strconv.Atoi(ra)
			return fmt.Errorf("%s %s: %w", method, path, &pool.OverloadedError{Function: functionOf(path),
				RetryAfter: time.Duration(max(0, after)) * time.Second, Reason: e.Error})
		}
		// 503 with Retry-After: the function is backed off after repeated kernel faults.
		if ra := resp.Header.Get("Retry-After"); resp.StatusCode == http.StatusServiceUnavailable && ra != "" {
			after, _ := strconv.Atoi(ra)
			return fmt.Errorf("%s %s: %w: %s", method, path, &pool.BackedOffError{Function: functionOf(path),
				RetryAfter: time.Duration(max(0, after)) * time.Second}, e.Error)
		}
		if e.Restart && resp.StatusCode == http.StatusServiceUnavailable {
			return fmt.Errorf("%w: %s %s: %s", pool.ErrFunctionLost, method, path, e.Error)
		}
		return fmt.Errorf("%w: %s %s: %s", sentinel(resp.StatusCode, path), method, path, e.Error)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

// sentinel maps an API status back to the error it came from (the inverse of api.StatusCode).
// functionOf is the function named in a /v1/functions/{name}/... path, or "".
func functionOf(path string) string {
	rest, ok := strings.CutPrefix(path, "/v1/functions/")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "/")
	if n, err := url.PathUnescape(name); err == nil {
		return n
	}
	return name
}

func sentinel(code int, path string) error {
	switch code {
	case http.StatusBadRequest:
		return pool.ErrInvalidSpec
	case http.StatusUnauthorized:
		return auth.ErrUnauthenticated
	case http.StatusForbidden:
		return auth.ErrForbidden
	case http.StatusTooManyRequests:
		return pool.ErrLimit
	case http.StatusNotFound:
		if strings.HasPrefix(path, "/v1/bindings/") {
			return pool.ErrUnknownBinding
		}
		return pool.ErrUnknownFunction
	case http.StatusUnprocessableEntity:
		return pool.ErrTooLarge
	case http.StatusGatewayTimeout:
		return context.DeadlineExceeded
	case http.StatusServiceUnavailable:
		if strings.HasPrefix(path, "/v1/bindings/") {
			return pool.ErrGPUUnhealthy
		}
		return ErrUnavailable
	default:
		return ErrUnavailable
	}
}
