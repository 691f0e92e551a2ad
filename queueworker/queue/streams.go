package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDeadLetterMaxAge is how long dead-letter entries are kept unless configured otherwise (the worker's
// DeadLetterMaxAge, `-dead-letter-max-age`).
const DefaultDeadLetterMaxAge = 24 * time.Hour

// ErrNotAQueue is returned (wrapped) when a stream is asked to be consumed as a queue but is not one.
var ErrNotAQueue = errors.New("not a queue stream")

// DuplicateWindow is how long JetStream remembers a call ID (Nats-Msg-Id) to drop a second publish of the same call.
const DuplicateWindow = 2 * time.Minute

// StreamConfig is the configuration of queue q's stream.
//
// Retention is work-queue: a message is removed once the worker acknowledges it, so the stream holds exactly the
// calls not yet finished and its size is the backlog. A work-queue stream allows one consumer per subject, which is
// what the worker's shared durable consumer is; several worker processes share that consumer to scale out. File
// storage keeps the backlog across NATS restarts.
//
// Its size is bounded (Limits): a publish that would take the backlog beyond QueueMaxBytes is refused (discard new:
// a call once accepted is never dropped for space; the front door answers 429), and a call still waiting after
// QueueMaxAge is removed.
func StreamConfig(q string) jetstream.StreamConfig {
	return streamConfig(q, DefaultLimits())
}

func streamConfig(q string, l Limits) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        Stream(q),
		Description: "faas-gpu asynchronous invocations of queue " + q,
		Subjects:    []string{Subject(q)},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    l.QueueMaxBytes,
		MaxAge:      l.QueueMaxAge,
		Duplicates:  DuplicateWindow,
		Replicas:    1,
	}
}

// DeadLetterStreamConfig is the configuration of the dead-letter stream: limits retention (entries stay for
// inspection until they are maxAge old, 0 meaning DefaultDeadLetterMaxAge, and the oldest go first once the stream
// holds DefaultDeadLetterMaxBytes), file storage.
func DeadLetterStreamConfig(maxAge time.Duration) jetstream.StreamConfig {
	l := DefaultLimits()
	if maxAge > 0 {
		l.DeadLetterMaxAge = maxAge
	}
	return deadLetterConfig(l)
}

func deadLetterConfig(l Limits) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DeadLetterStream,
		Description: "faas-gpu asynchronous invocations given up on, with the reason in " + HeaderDeadLetterReason,
		Subjects:    []string{DeadLetterSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		MaxAge:      l.DeadLetterMaxAge,
		MaxBytes:    l.DeadLetterMaxBytes,
		Replicas:    1,
	}
}

// Ensure creates the streams of the given queues (the default queue when none is given) and the dead-letter
// stream where they are missing. A stream that exists is left as it is, so that an operator's settings (replicas
// in a NATS cluster, limits) survive every start of the front door and the worker.
func Ensure(ctx context.Context, js jetstream.JetStream, queues ...string) error {
	if len(queues) == 0 {
		queues = []string{DefaultQueue}
	}
	for _, q := range queues {
		if err := contract.ValidateQueueName(q); err != nil {
			return err
		}
		if err := create(ctx, js, StreamConfig(q)); err != nil {
			return err
		}
	}
	return create(ctx, js, DeadLetterStreamConfig(0))
}

// EnsureDeadLetter creates the dead-letter stream with entries kept for maxAge (0: DefaultDeadLetterMaxAge), or
// sets the MaxAge of the existing one to it (the worker writes the dead letters, so its setting is the one that
// holds); its byte limit is DefaultDeadLetterMaxBytes unless it has one. Other settings of an existing stream are
// left as they are.
func EnsureDeadLetter(ctx context.Context, js jetstream.JetStream, maxAge time.Duration) error {
	l := DefaultLimits()
	if maxAge > 0 {
		l.DeadLetterMaxAge = maxAge
	}
	l.DeadLetterMaxBytes = 0 // keep an existing limit
	return ApplyLimits(ctx, js, l)
}

// CheckQueueStream refuses to treat a stream as queue q unless q is a valid queue name (never a reserved one) and
// the stream is q's: named Stream(q), work-queue retention, exactly q's subject. The worker checks it before it
// creates a consumer, so that it never consumes the dead letters or any stream that is not a queue.
func CheckQueueStream(cfg jetstream.StreamConfig, q string) error {
	if err := contract.ValidateQueueName(q); err != nil {
		return err
	}
	if cfg.Name != Stream(q) || cfg.Retention != jetstream.WorkQueuePolicy || len(cfg.Subjects) != 1 ||
		cfg.Subjects[0] != Subject(q) {
		return fmt.Errorf("%w: stream %s (retention %s, subjects %v) is not the stream of queue %q (want %s, work-queue retention, subject %s)",
			ErrNotAQueue, cfg.Name, cfg.Retention, cfg.Subjects, q, Stream(q), Subject(q))
	}
	return nil
}

func create(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	_, err := js.CreateStream(ctx, cfg)
	if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil
	}
	return fmt.Errorf("queue: stream %s: %w", cfg.Name, err)
}
