package queue

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// State is one queue's state as JetStream sees it (for `faas-gpu pool` and dashboards).
type State struct {
	// Queue name and its stream.
	Queue, Stream string
	// Messages in the stream: calls not yet finished (work-queue retention removes a message once acked).
	Messages uint64
	// Pending is the messages no worker has been handed yet; AckPending those handed to a worker and not yet
	// acked (waiting in its window, running, or waiting out a retry backoff); Redelivered those delivered more
	// than once and not yet acked.
	Pending, AckPending, Redelivered uint64
	// Consumers on the stream.
	Consumers int
}

// States returns the state of every queue stream (names starting with StreamPrefix, the dead-letter stream
// excluded) and the number of dead-letter entries.
func States(ctx context.Context, js jetstream.JetStream) ([]State, uint64, error) {
	var states []State
	var dead uint64
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		name := info.Config.Name
		if name == DeadLetterStream {
			dead = info.State.Msgs
			continue
		}
		if !strings.HasPrefix(name, StreamPrefix) {
			continue
		}
		st := State{Queue: strings.TrimPrefix(name, StreamPrefix), Stream: name, Messages: info.State.Msgs,
			Consumers: info.State.Consumers}
		stream, err := js.Stream(ctx, name)
		if err != nil {
			return nil, 0, fmt.Errorf("queue: stream %s: %w", name, err)
		}
		cl := stream.ListConsumers(ctx)
		for ci := range cl.Info() {
			st.Pending += ci.NumPending
			st.AckPending += uint64(ci.NumAckPending)
			st.Redelivered += uint64(ci.NumRedelivered)
		}
		if err := cl.Err(); err != nil {
			return nil, 0, fmt.Errorf("queue: consumers of %s: %w", name, err)
		}
		states = append(states, st)
	}
	if err := lister.Err(); err != nil {
		return nil, 0, fmt.Errorf("queue: listing streams: %w", err)
	}
	slices.SortFunc(states, func(a, b State) int { return strings.Compare(a.Queue, b.Queue) })
	return states, dead, nil
}
