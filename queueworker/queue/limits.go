package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Limits.
const (
	// DefaultQueueMaxBytes bounds each queue's backlog: 4096 calls of the largest body, far more of usual ones.
	DefaultQueueMaxBytes = 1 << 30
	// DefaultQueueMaxAge removes a call that has waited a day: its caller has long stopped waiting for the
	// callback.
	DefaultQueueMaxAge = 24 * time.Hour
	// DefaultDeadLetterMaxBytes bounds the dead letters; the oldest go first. Calls whose callbacks keep failing
	// (a flood of them with large bodies) can fill it in seconds, never beyond it.
	DefaultDeadLetterMaxBytes = 256 << 20
)

// Limits bound what the streams hold, so that neither a backlog nor a flood of failing calls fills the disk. A
// zero field means its default (DefaultLimits); a negative one means no bound.
type Limits struct {
	// QueueMaxBytes bounds each queue stream: a publish beyond it is refused (the front door answers 429), a call
	// once accepted is never dropped for space.
	QueueMaxBytes int64
	// QueueMaxAge removes calls that have waited longer.
	QueueMaxAge time.Duration
	// DeadLetterMaxBytes bounds the dead-letter stream; the oldest entries are removed first.
	DeadLetterMaxBytes int64
	// DeadLetterMaxAge removes dead letters older than this.
	DeadLetterMaxAge time.Duration
}

// DefaultLimits are the limits of streams created without others.
func DefaultLimits() Limits {
	return Limits{QueueMaxBytes: DefaultQueueMaxBytes, QueueMaxAge: DefaultQueueMaxAge,
		DeadLetterMaxBytes: DefaultDeadLetterMaxBytes, DeadLetterMaxAge: DefaultDeadLetterMaxAge}
}

// WithDefaults fills zero fields with the defaults and turns negative ones into JetStream's "no limit".
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	fill := func(v *int64, def int64) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			*v = -1
		}
	}
	fillAge := func(v *time.Duration, def time.Duration) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			*v = 0 // JetStream: no max age
		}
	}
	fill(&l.QueueMaxBytes, d.QueueMaxBytes)
	fill(&l.DeadLetterMaxBytes, d.DeadLetterMaxBytes)
	fillAge(&l.QueueMaxAge, d.QueueMaxAge)
	fillAge(&l.DeadLetterMaxAge, d.DeadLetterMaxAge)
	return l
}

// ApplyLimits gives the queue streams of queues and the dead-letter stream the limits l (WithDefaults), creating
// them where missing; a zero field of l leaves an existing stream's value as it is (an operator's setting). The
// worker calls it at start: it writes the dead letters and drains the queues, so its limits hold.
func ApplyLimits(ctx context.Context, js jetstream.JetStream, l Limits, queues ...string) error {
	want := l.WithDefaults()
	for _, q := range queues {
		if err := contract.ValidateQueueName(q); err != nil {
			return err
		}
		err := apply(ctx, js, streamConfig(q, want), func(cfg *jetstream.StreamConfig) bool {
			changed := setLimit(&cfg.MaxBytes, l.QueueMaxBytes, want.QueueMaxBytes)
			if cfg.MaxBytes <= 0 && l.QueueMaxBytes == 0 { // a stream from before limits: bound it
				cfg.MaxBytes, changed = want.QueueMaxBytes, true
			}
			changed = setAge(&cfg.MaxAge, l.QueueMaxAge, want.QueueMaxAge) || changed
			if cfg.MaxBytes > 0 && cfg.Discard != jetstream.DiscardNew { // never drop accepted calls for space
				cfg.Discard, changed = jetstream.DiscardNew, true
			}
			return changed
		})
		if err != nil {
			return err
		}
	}
	return apply(ctx, js, deadLetterConfig(want), func(cfg *jetstream.StreamConfig) bool {
		changed := setLimit(&cfg.MaxBytes, l.DeadLetterMaxBytes, want.DeadLetterMaxBytes)
		if cfg.MaxBytes <= 0 && l.DeadLetterMaxBytes == 0 { // a stream from before limits: bound it
			cfg.MaxBytes, changed = want.DeadLetterMaxBytes, true
		}
		return setAge(&cfg.MaxAge, l.DeadLetterMaxAge, want.DeadLetterMaxAge) || changed
	})
}

// setLimit sets *v to want when the setting asked for a value (set != 0) and *v differs.
func setLimit(v *int64, set, want int64) bool {
	if set == 0 || *v == want {
		return false
	}
	*v = want
	return true
}

func setAge(v *time.Duration, set, want time.Duration) bool {
	if set == 0 || *v == want {
		return false
	}
	*v = want
	return true
}

// apply creates the stream of cfg, or updates the existing one when change alters its configuration.
func apply(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig,
	change func(*jetstream.StreamConfig) bool) error {
	st, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return create(ctx, js, cfg)
	}
	if err != nil {
		return fmt.Errorf("queue: stream %s: %w", cfg.Name, err)
	}
	have := st.CachedInfo().Config
	if !change(&have) {
		return nil
	}
	if _, err := js.UpdateStream(ctx, have); err != nil {
		return fmt.Errorf("queue: setting the limits of %s (max bytes %d, max age %s): %w", cfg.Name, have.MaxBytes,
			have.MaxAge, err)
	}
	return nil
}

// IsFull reports whether a publish failed because the queue's stream holds QueueMaxBytes (or an operator's
// message limit) already.
func IsFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	d := apiErr.Description
	return strings.Contains(d, "maximum bytes exceeded") || strings.Contains(d, "maximum messages exceeded")
}
