package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/queueing"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// ErrInvalidConfig is wrapped by every configuration error; the message names the field.
var ErrInvalidConfig = errors.New("invalid queue worker config")

// ConfigError is a configuration error (it wraps ErrInvalidConfig): Field names the Config field at fault, so that
// a command can name the flag that set it.
type ConfigError struct {
	Field string
	err   error
}

func (e *ConfigError) Error() string { return e.err.Error() }
func (e *ConfigError) Unwrap() error { return e.err }

// invalid is a ConfigError of field; format and args follow ErrInvalidConfig's text.
func invalid(field, format string, args ...any) error {
	return &ConfigError{Field: field, err: fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)}
}

// Capacity reports the GPU pool's state; the gpuserver client (gpuserver/client.Client) satisfies it.
type Capacity interface {
	Status(ctx context.Context) (pool.Status, error)
}

// Ordering names how the worker picks the next message from its lookahead window.
type Ordering = queueing.Order

// Orderings the worker offers (the gpuserver/queueing library's).
const (
	OrderFIFO     = queueing.OrderFIFO
	OrderSLOAware = queueing.OrderSLOAware
)

// RetryPolicy is a capped exponential backoff: attempt k (from 0) waits min(MaxBackoff, InitialBackoff*2^k)
// before attempt k+1.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts including the first; 1 means no retry.
	MaxAttempts int
	// InitialBackoff is the wait after the first failed attempt.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait.
	MaxBackoff time.Duration
}

// Backoff is the wait after failed attempt k (from 0).
func (p RetryPolicy) Backoff(k int) time.Duration {
	d := p.InitialBackoff
	for i := 0; i < k && d < p.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.MaxBackoff)
}

func (p RetryPolicy) validate(field string) error {
	switch {
	case p.MaxAttempts < 1:
		return invalid(field+".MaxAttempts", "%s.MaxAttempts must be >= 1", field)
	case p.InitialBackoff <= 0:
		return invalid(field+".InitialBackoff", "%s.InitialBackoff must be > 0", field)
	case p.MaxBackoff < p.InitialBackoff:
		return invalid(field+".MaxBackoff", "%s.MaxBackoff must be >= InitialBackoff", field)
	}
	return nil
}

// DefaultRetryStatuses are the function statuses worth another attempt.
var defaultRetryStatuses = []int{http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
	http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout}

// DefaultRetryStatuses returns the statuses retried when Config.RetryStatuses is empty: 408, 429, 500, 502, 503, 504.
func DefaultRetryStatuses() []int { return slices.Clone(defaultRetryStatuses) }

// Config configures a Worker. Zero fields take the defaults noted.
type Config struct {
	// JetStream consumes the queues. When nil, the worker connects to NATSURL itself (reconnecting forever) and
	// closes the connection when Run returns.
	JetStream jetstream.JetStream
	// NATSURL is used when JetStream is nil.
	NATSURL string
	// NATSUser and NATSPassword authenticate the connection to NATSURL (credentials in the URL work too).
	NATSUser, NATSPassword string
	// Durable is the name of the durable pull consumer on every queue stream; default "faas-gpu-queue-worker".
	// Workers with the same name share the work.
	Durable string
	// Queues to consume; default [queue.DefaultQueue]. Their streams are created when missing.
	Queues []string
	// DiscoverQueues is how often the worker lists functions (when Functions is also a functions.Lister) to
	// find named queues (com.openfaas.queue) and start consuming them; 0 means 10s, negative disables it.
	// Each queue has its own stream, its own pull requests and its share of the window (window / queues); a
	// queue runs at most MaxInflight - (queues - 1) messages at once (at least 1), so one slot is always kept
	// for each other queue and a backlog on one queue cannot hold back another.
	DiscoverQueues time.Duration

	// GatewayURL is the base URL functions are invoked through: <GatewayURL>/function/<name><path>?<query>.
	// The worker builds that URL itself from the checked parts of a message (queue.CheckRequest), so that no
	// message can steer it elsewhere on the gateway, and follows no redirect.
	GatewayURL string
	// MaxInflight bounds concurrent invocations; default 2 x the pool's GPU slots when Capacity is set (at
	// least 16), else 16.
	MaxInflight int
	// Lookahead is how many messages beyond MaxInflight are held to be ordered; default 4 x MaxInflight, at
	// least 1024. Ordering sees only the window: under a backlog deeper than the window, messages that can no
	// longer meet their deadline still fill it (they are served oldest first after every feasible one), so the
	// window should hold a burst. Holding a message costs memory and an in-progress ack every AckWait/3;
	// the ordering policy's cost grows with the functions waiting, not with the window.
	Lookahead int
	// AckWait is the consumer's ack wait; a message held longer without an in-progress ack is redelivered. The
	// worker sends in-progress acks every AckWait/3 for every message it holds. Default 30s.
	AckWait time.Duration
	// MaxAckPending bounds messages delivered and not yet acked across all workers sharing the consumer
	// (including messages waiting out a retry backoff); default 10000.
	MaxAckPending int
	// Retry is the invocation retry policy; default 5 attempts, 250ms doubling to 30s. The attempt number is
	// JetStream's delivery count, so a redelivery after a worker crash counts as an attempt.
	Retry RetryPolicy
	// RetryStatuses are the function statuses retried; default DefaultRetryStatuses(). Connection errors and
	// timeouts are always retried.
	RetryStatuses []int
	// MaxDeliveries sends a message delivered more often than this to the dead letters without invoking it (a
	// message whose invocation keeps killing workers); default Retry.MaxAttempts + 10.
	MaxDeliveries int
	// CallbackRetry is the callback retry policy; default 5 attempts, 200ms doubling to 5s. A callback that
	// still fails is counted, logged and dead-lettered with reason callback_failed, then the message is acked.
	CallbackRetry RetryPolicy
	// InvokeTimeout bounds one invocation (HTTP client timeout); default 5m.
	InvokeTimeout time.Duration
	// CallbackTimeout bounds one callback attempt; default 30s.
	CallbackTimeout time.Duration
	// Client makes invocations; default a pooled client that follows no redirect. Timeouts come from
	// InvokeTimeout through request contexts. Callbacks use a client of their own that carries no credentials,
	// follows no redirect and refuses to dial ForbiddenCallbackHosts.
	Client *http.Client
	// ForbiddenCallbackHosts are host:port addresses callbacks must never reach (reason callback_refused); the
	// gateway's (GatewayURL) is always one. They are compared with the address actually dialled, after name
	// resolution: a loopback or unspecified host stands for every address of this machine on that port.
	ForbiddenCallbackHosts []string
	// MaxMessageBytes sends larger messages to the dead letters (reason oversized); default
	// queue.MaxMessageBytes.
	MaxMessageBytes int
	// DeadLetterMaxAge is how long dead-letter entries are kept; default queue.DefaultDeadLetterMaxAge (a day).
	// The worker sets it on the dead-letter stream at start.
	DeadLetterMaxAge time.Duration
	// DeadLetterMaxBytes bounds the dead-letter stream (the oldest entries go first); default
	// queue.DefaultDeadLetterMaxBytes, negative for no bound. The worker sets it at start.
	DeadLetterMaxBytes int64
	// QueueMaxBytes bounds each queue stream's backlog (a publish beyond it is refused: the front door answers
	// 429); default queue.DefaultQueueMaxBytes, negative for no bound. QueueMaxAge removes calls that waited
	// longer; default queue.DefaultQueueMaxAge, negative for no bound. The worker sets both on its queues' streams.
	QueueMaxBytes int64
	QueueMaxAge   time.Duration
	// DeadLetterDropBodies keeps request bodies out of dead-letter entries (they keep the call's method, path,
	// headers and reason). Entries never keep Authorization, Proxy-Authorization or Cookie headers.
	DeadLetterDropBodies bool
	// MaxResponseBytes caps the function response forwarded to the callback; default 16 MiB.
	MaxResponseBytes int64

	// Functions resolves SLO annotations and unknown functions; when nil every function is known, without SLO,
	// on the CPU.
	Functions functions.Source
	// UnknownGrace: a message for a function the Functions source does not know is given back (nak with delay
	// UnknownGrace/4) until it is UnknownGrace old (from X-Start-Time), in case the function was deployed a
	// moment ago, then dead-lettered with reason unknown_function and a 404 callback. Default 10s; negative
	// dead-letters at once.
	UnknownGrace time.Duration
	// Capacity, when set, admits GPU functions' dispatch by the pool: at most CapacityPerGPU x healthy GPUs
	// invocations of GPU functions run at once.
	Capacity Capacity
	// CapacityPerGPU is the GPU invocations admitted per healthy GPU; default 1.
	CapacityPerGPU int
	// CapacityRefresh is how often the pool's status is read; default 1s.
	CapacityRefresh time.Duration
	// Order picks the next message from the window: OrderSLOAware (default) or OrderFIFO (or any order of
	// gpuserver/queueing).
	Order Ordering

	// Registerer receives the worker's Prometheus metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// DrainTimeout bounds the graceful drain when Run's ctx ends; default 30s. Invocations still running then
	// are cancelled and their messages given back (nak) for redelivery.
	DrainTimeout time.Duration
}

// limits are the streams' limits this worker sets (queue.ApplyLimits).
func (c *Config) limits() queue.Limits {
	return queue.Limits{QueueMaxBytes: c.QueueMaxBytes, QueueMaxAge: c.QueueMaxAge,
		DeadLetterMaxBytes: c.DeadLetterMaxBytes, DeadLetterMaxAge: c.DeadLetterMaxAge}
}

// Validate checks cfg as New does, with the defaults of its zero fields, and changes nothing: the one place the
// worker's settings are checked, for a command to call before it starts anything.
func (c Config) Validate() error {
	c.ForbiddenCallbackHosts = slices.Clone(c.ForbiddenCallbackHosts)
	c.Queues = slices.Clone(c.Queues)
	return c.setDefaults()
}

func (c *Config) setDefaults() error {
	if c.JetStream == nil && c.NATSURL == "" {
		return invalid("NATSURL", "JetStream or NATSURL is required")
	}
	if c.JetStream == nil {
		if u, err := url.Parse(c.NATSURL); err != nil || u.Host == "" {
			return invalid("NATSURL", "NATSURL %q is not a URL such as nats://127.0.0.1:4222", c.NATSURL)
		}
	}
	if c.Durable == "" {
		c.Durable = "faas-gpu-queue-worker"
	}
	if strings.ContainsAny(c.Durable, ". *>\t") {
		return invalid("Durable", "Durable %q may not contain '.', '*', '>' or spaces", c.Durable)
	}
	if len(c.Queues) == 0 {
		c.Queues = []string{queue.DefaultQueue}
	}
	for _, q := range c.Queues {
		if err := contract.ValidateQueueName(q); err != nil {
			return &ConfigError{Field: "Queues", err: fmt.Errorf("%w: Queues: %w", ErrInvalidConfig, err)}
		}
	}
	u, err := url.Parse(c.GatewayURL)
	if c.GatewayURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return invalid("GatewayURL", "GatewayURL %q must be an absolute http(s) URL", c.GatewayURL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return invalid("GatewayURL", "GatewayURL %q must have no query, fragment or credentials", c.GatewayURL)
	}
	c.GatewayURL = strings.TrimRight(c.GatewayURL, "/")
	if c.MaxInflight < 0 {
		return invalid("MaxInflight", "MaxInflight must be >= 0 (0: sized to the pool)")
	}
	if c.Lookahead < 0 {
		return invalid("Lookahead", "Lookahead must be >= 0")
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.AckWait < 300*time.Millisecond {
		return invalid("AckWait", "AckWait must be >= 300ms")
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 10000
	}
	if c.Retry == (RetryPolicy{}) {
		c.Retry = RetryPolicy{MaxAttempts: 5, InitialBackoff: 250 * time.Millisecond, MaxBackoff: 30 * time.Second}
	}
	if err := c.Retry.validate("Retry"); err != nil {
		return err
	}
	if len(c.RetryStatuses) == 0 {
		c.RetryStatuses = DefaultRetryStatuses()
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = c.Retry.MaxAttempts + 10
	}
	if c.MaxDeliveries < c.Retry.MaxAttempts {
		return invalid("MaxDeliveries", "MaxDeliveries must be >= Retry.MaxAttempts")
	}
	if c.CallbackRetry == (RetryPolicy{}) {
		c.CallbackRetry = RetryPolicy{MaxAttempts: 5, InitialBackoff: 200 * time.Millisecond, MaxBackoff: 5 * time.Second}
	}
	if err := c.CallbackRetry.validate("CallbackRetry"); err != nil {
		return err
	}
	if c.InvokeTimeout == 0 {
		c.InvokeTimeout = 5 * time.Minute
	}
	if c.CallbackTimeout == 0 {
		c.CallbackTimeout = 30 * time.Second
	}
	if c.InvokeTimeout < 0 {
		return invalid("InvokeTimeout", "InvokeTimeout must be > 0")
	}
	if c.CallbackTimeout < 0 {
		return invalid("CallbackTimeout", "CallbackTimeout must be > 0")
	}
	if c.Client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 1024
		t.MaxIdleConns = 2048
		c.Client = &http.Client{Transport: t, CheckRedirect: noRedirects}
	}
	c.ForbiddenCallbackHosts = append(slices.Clone(c.ForbiddenCallbackHosts), hostPort(u))
	for _, h := range c.ForbiddenCallbackHosts {
		if _, _, err := net.SplitHostPort(h); err != nil {
			return invalid("ForbiddenCallbackHosts", "ForbiddenCallbackHosts: %q is not host:port", h)
		}
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = queue.MaxMessageBytes
	}
	if err := c.ValidateStreams(); err != nil {
		return err
	}
	if c.DeadLetterMaxAge == 0 {
		c.DeadLetterMaxAge = queue.DefaultDeadLetterMaxAge
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 16 << 20
	}
	if c.UnknownGrace == 0 {
		c.UnknownGrace = 10 * time.Second
	}
	if c.CapacityPerGPU == 0 {
		c.CapacityPerGPU = 1
	}
	if c.CapacityPerGPU < 0 {
		return invalid("CapacityPerGPU", "CapacityPerGPU must be >= 1")
	}
	if c.CapacityRefresh == 0 {
		c.CapacityRefresh = time.Second
	}
	if c.Order == "" {
		c.Order = OrderSLOAware
	}
	if _, err := queueing.New(queueing.Config{Order: c.Order}); err != nil {
		return &ConfigError{Field: "Order", err: fmt.Errorf("%w: Order: %w", ErrInvalidConfig, err)}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.DrainTimeout < 0 {
		return invalid("DrainTimeout", "DrainTimeout must be > 0")
	}
	return nil
}

// ValidateStreams checks the settings of the streams the worker manages (DeadLetterMaxAge and the limits
// QueueMaxBytes, QueueMaxAge, DeadLetterMaxBytes), with the defaults of their zero values. Validate checks them
// too; a command that starts the worker later (with its NATS connection) checks them with this at start-up.
func (c Config) ValidateStreams() error {
	if c.DeadLetterMaxAge != 0 && c.DeadLetterMaxAge < time.Second {
		return invalid("DeadLetterMaxAge", "DeadLetterMaxAge must be at least 1s")
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"QueueMaxBytes", c.QueueMaxBytes}, {"DeadLetterMaxBytes", c.DeadLetterMaxBytes}} {
		if f.v > 0 && f.v < queue.MaxMessageBytes {
			return invalid(f.name, "%s %d must hold one message of queue.MaxMessageBytes (%d), or be negative for no bound",
				f.name, f.v, queue.MaxMessageBytes)
		}
	}
	return nil
}

// noRedirects makes a client return a redirect as the answer instead of following it: a function's answer is
// reported as it is (as the synchronous proxy does), and neither a function nor a callback endpoint can send the
// worker somewhere else.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// hostPort is u's host:port, with the scheme's default port when u names none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}
