package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DeadLetterMaxAge is how long dead-letter entries are kept.
const DeadLetterMaxAge = 7 * 24 * time.Hour

// DuplicateWindow is how long JetStream remembers a call ID (Nats-Msg-Id) to drop a second publish of the same call.
const DuplicateWindow = 2 * time.Minute

// StreamConfig is the configuration of queue q's stream.
//
// Retention is work-queue: a message is removed once the worker acknowledges it, so the stream holds exactly the
// calls not yet finished and its size is the backlog. A work-queue stream allows one consumer per subject, which is
// what the worker's shared durable consumer is; several worker processes share that consumer to scale out. File
// storage keeps the backlog across NATS restarts.
func StreamConfig(q string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        Stream(q),
		Description: "faas-gpu asynchronous invocations of queue " + q,
		Subjects:    []string{Subject(q)},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		Duplicates:  DuplicateWindow,
		Replicas:    1,
	}
}

// DeadLetterStreamConfig is the configuration of the dead-letter stream: limits retention (entries stay for
// inspection until they age out), file storage.
func DeadLetterStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DeadLetterStream,
		Description: "faas-gpu asynchronous invocations given up on, with the reason in " + HeaderDeadLetterReason,
		Subjects:    []string{DeadLetterSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		MaxAge:      DeadLetterMaxAge,
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
		if err := ValidateName(q); err != nil {
			return err
		}
		if err := create(ctx, js, StreamConfig(q)); err != nil {
			return err
		}
	}
	return create(ctx, js, DeadLetterStreamConfig())
}

func create(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	_, err := js.CreateStream(ctx, cfg)
	if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil
	}
	return fmt.Errorf("queue: stream %s: %w", cfg.Name, err)
}
