// Package client calls a gpuserver's API (package api) over its Unix socket or TCP. Errors wrap the pool's
// sentinels (pool.ErrUnknownFunction, ...) so callers test them with errors.Is, whichever side of the socket they
// came from.
package client

import (
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
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// ErrUnavailable: the gpuserver could not be reached or answered with a server error.
var ErrUnavailable = errors.New("gpuserver unavailable")

// Client talks to one gpuserver.
type Client struct {
	base string
	http *http.Client
}

// New returns a client for the gpuserver listening on the Unix socket at socketPath.
func New(socketPath string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{base: "http://gpuserver", http: &http.Client{Transport: tr}}
}

// NewTCP returns a client for a gpuserver at baseURL, e.g. http://127.0.0.1:8090.
func NewTCP(baseURL string) *Client {
	return &Client{base: strings.TrimRight(baseURL, "/"), http: &http.Client{}}
}

// Register adds or updates a GPU function. It satisfies provider.GPURegistry.
func (c *Client) Register(ctx context.Context, spec pool.FunctionSpec) error {
	return c.do(ctx, http.MethodPost, "/v1/functions", spec, nil)
}

// Deregister removes a GPU function; an unknown name is not an error.
func (c *Client) Deregister(ctx context.Context, name string) error {
	err := c.do(ctx, http.MethodDelete, "/v1/functions/"+url.PathEscape(name), nil, nil)
	if errors.Is(err, pool.ErrUnknownFunction) {
		return nil
	}
	return err
}

// Acquire waits for a binding of function to a GPU, for at most timeout (0: the server's default).
func (c *Client) Acquire(ctx context.Context, function string, timeout time.Duration) (pool.Binding, error) {
	var b pool.Binding
	body := map[string]int64{}
	if timeout > 0 {
		body["timeout_ms"] = max(1, timeout.Milliseconds())
	}
	err := c.do(ctx, http.MethodPost, "/v1/functions/"+url.PathEscape(function)+"/acquire", body, &b)
	return b, err
}

// Release ends a binding.
func (c *Client) Release(ctx context.Context, bindingID string) error {
	return c.do(ctx, http.MethodPost, "/v1/bindings/"+url.PathEscape(bindingID)+"/release", nil, nil)
}

// Status returns the pool's snapshot.
func (c *Client) Status(ctx context.Context) (pool.Status, error) {
	var st pool.Status
	err := c.do(ctx, http.MethodGet, "/v1/pool", nil, &st)
	return st, err
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		buf, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(raw))
		}
		if resp.StatusCode == http.StatusTooManyRequests { // shed by the overload control
			after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			return fmt.Errorf("%s %s: %w", method, path, &pool.OverloadedError{Function: functionOf(path),
				RetryAfter: time.Duration(max(0, after)) * time.Second, Reason: e.Error})
		}
		return fmt.Errorf("%w: %s %s: %s", sentinel(resp.StatusCode, path), method, path, e.Error)
	}
	if out == nil {
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
