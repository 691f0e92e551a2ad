package queue

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/openfaas/faas-provider/types"
)

// Size limits of the asynchronous path, one set end to end: the front door refuses a larger body with 413 naming
// MaxBodyBytes; the embedded NATS server's max_payload (and the chart's) is MaxMessageBytes; the worker accepts
// messages up to MaxMessageBytes.
const (
	// MaxBodyBytes is the largest request body an asynchronous call may carry: 4 MiB.
	MaxBodyBytes = 4 << 20
	// MaxMessageBytes is the largest queue message (and the NATS max_payload the queues need): 8 MiB. A queue
	// request carries its body in base64 (4/3 larger: 5.34 MiB for MaxBodyBytes) beside the request's headers
	// (the HTTP server's 1 MiB header limit, at most doubled by JSON escaping), so that every request the front
	// door accepts fits. A dead-letter entry is the same message with fewer headers.
	MaxMessageBytes = 8 << 20
)

// ErrInvalidRequest is returned (wrapped) for a queue request the worker must not invoke; the message names the
// field.
var ErrInvalidRequest = errors.New("invalid queue request")

// Methods are the HTTP methods an asynchronous call may use (those the synchronous proxy forwards).
var methods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
	http.MethodOptions, http.MethodHead}

// CheckMethod checks an asynchronous call's method ("" means POST).
func CheckMethod(m string) error {
	if m == "" {
		return nil
	}
	for _, ok := range methods {
		if m == ok {
			return nil
		}
	}
	return fmt.Errorf("%w: Method %q is not one of %s", ErrInvalidRequest, m, strings.Join(methods, ", "))
}

// maxDecodeRounds bounds how often CheckPath percent-decodes a path; a path that still decodes to something new
// after that many rounds is refused.
const maxDecodeRounds = 8

// CheckPath checks the path a call adds after /function/<name> (QueueRequest.Path: "" or starting with '/', as
// decoded once by the HTTP server). It is decoded again and again until nothing changes, and that fully decoded
// form must have no "." or ".." segment, no backslash and no control character: so no layer that decodes once more
// (a gateway, a proxy, a function's framework) can read the path as climbing out of the function.
func CheckPath(p string) error {
	if p == "" {
		return nil
	}
	if p[0] != '/' {
		return fmt.Errorf("%w: Path %q must start with '/'", ErrInvalidRequest, p)
	}
	decoded := p
	for round := 0; ; round++ {
		next, err := url.PathUnescape(decoded)
		if err != nil || next == decoded {
			break // nothing more to decode ("100%" is a literal per cent sign)
		}
		if round == maxDecodeRounds {
			return fmt.Errorf("%w: Path %q is percent-encoded more than %d times", ErrInvalidRequest, p, maxDecodeRounds)
		}
		decoded = next
	}
	for i := 0; i < len(decoded); i++ {
		if c := decoded[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return fmt.Errorf("%w: Path %q holds a control character or a backslash once decoded", ErrInvalidRequest, p)
		}
	}
	for _, seg := range strings.Split(decoded, "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("%w: Path %q climbs out of the function (a %q segment once decoded)", ErrInvalidRequest, p, seg)
		}
	}
	return nil
}

// CheckQuery checks a call's raw query string: printable ASCII without spaces or '#'.
func CheckQuery(q string) error {
	for i := 0; i < len(q); i++ {
		if c := q[i]; c <= ' ' || c >= 0x7f || c == '#' {
			return fmt.Errorf("%w: QueryString %q may hold only printable ASCII without spaces or '#'", ErrInvalidRequest, q)
		}
	}
	return nil
}

// CheckCallback checks a callback URL: absolute http or https with a host.
func CheckCallback(u *url.URL) error {
	if u == nil {
		return nil
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: CallbackURL %q is not an absolute http(s) URL", ErrInvalidRequest, u.Redacted())
	}
	return nil
}

// CheckHeader checks that every header name is an HTTP token and no value holds CR, LF or NUL.
func CheckHeader(h http.Header) error {
	for k, vs := range h {
		if k == "" || strings.IndexFunc(k, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
			return fmt.Errorf("%w: Header name %q is not an HTTP token", ErrInvalidRequest, k)
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n\x00") {
				return fmt.Errorf("%w: Header %s holds CR, LF or NUL", ErrInvalidRequest, k)
			}
		}
	}
	return nil
}

func isTokenChar(r rune) bool {
	return r < 0x7f && r > ' ' && !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
}

// CheckRequest checks everything of a queue request that steers where and how the worker invokes and calls back:
// the function reference, method, path, query, headers and callback URL. The front door checks the same before it
// publishes, and the worker again before it invokes, since a message may reach NATS by other ways.
func CheckRequest(r *types.QueueRequest) error {
	if err := ValidateFunctionName(r.Function); err != nil {
		return fmt.Errorf("%w: Function: %w", ErrInvalidRequest, err)
	}
	if err := CheckMethod(r.Method); err != nil {
		return err
	}
	if err := CheckPath(r.Path); err != nil {
		return err
	}
	if err := CheckQuery(r.QueryString); err != nil {
		return err
	}
	if err := CheckHeader(r.Header); err != nil {
		return err
	}
	return CheckCallback(r.CallbackURL)
}

// sensitiveHeaders are never kept in a dead-letter entry.
var sensitiveHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie"}

// WithoutCredentials returns a copy of h without the headers that carry a client's credentials (Authorization,
// Proxy-Authorization, Cookie).
func WithoutCredentials(h http.Header) http.Header {
	out := h.Clone()
	for _, k := range sensitiveHeaders {
		out.Del(k)
	}
	for k := range out { // a header stored under a non-canonical key
		for _, s := range sensitiveHeaders {
			if strings.EqualFold(k, s) {
				delete(out, k)
			}
		}
	}
	return out
}
