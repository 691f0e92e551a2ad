package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// consumer creates (or updates) the worker's durable pull consumer on queue q's stream, creating the stream when
// missing. It refuses a reserved queue name and any stream that is not q's work queue (queue.CheckQueueStream):
// the worker never consumes the dead letters.
func (w *Worker) consumer(ctx context.Context, js jetstream.JetStream, q string) (jetstream.Consumer, error) {
	if err := queue.ApplyLimits(ctx, js, w.cfg.limits(), q); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	st, err := js.Stream(ctx, queue.Stream(q))
	if err != nil {
		return nil, fmt.Errorf("worker: stream %s: %w", queue.Stream(q), err)
	}
	if err := queue.CheckQueueStream(st.CachedInfo().Config, q); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, queue.Stream(q), jetstream.ConsumerConfig{
		Durable:       w.cfg.Durable,
		Description:   "faas-gpu queue worker",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       w.cfg.AckWait,
		MaxDeliver:    -1, // the worker counts deliveries itself (Retry, MaxDeliveries) and dead-letters
		MaxAckPending: w.cfg.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("worker: consumer %s on stream %s: %w", w.cfg.Durable, queue.Stream(q), err)
	}
	return c, nil
}

// dropDeadLetterConsumer deletes this worker's durable consumer from the dead-letter stream where an earlier
// version made one (a function annotated with the dead-letter queue's name made it consume its own dead letters).
func (w *Worker) dropDeadLetterConsumer(ctx context.Context, js jetstream.JetStream) {
	err := js.DeleteConsumer(ctx, queue.DeadLetterStream, w.cfg.Durable)
	switch {
	case err == nil:
		w.cfg.Logger.Warn("queue worker: deleted its consumer on the dead-letter stream (left by an earlier version)",
			"stream", queue.DeadLetterStream, "consumer", w.cfg.Durable)
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
	default:
		w.cfg.Logger.Warn("queue worker: checking for a consumer on the dead-letter stream failed", "err", err)
	}
}

// discoverLoop finds named queues (com.openfaas.queue) of deployed functions every DiscoverQueues and starts
// consuming each new one: its stream and consumer are created and start is called.
func (w *Worker) discoverLoop(ctx context.Context, js jetstream.JetStream, lister functions.Lister,
	known map[string]jetstream.Consumer, start func(string, jetstream.Consumer)) {
	have := map[string]bool{}
	for q := range known {
		have[q] = true
	}
	every := w.cfg.DiscoverQueues
	if every == 0 {
		every = 10 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if fns, err := lister.Functions(ctx); err == nil {
			for _, f := range fns {
				if f.Queue == "" || have[f.Queue] {
					continue
				}
				c, err := w.consumer(ctx, js, f.Queue)
				if err != nil {
					w.cfg.Logger.Warn("queue worker: cannot consume named queue", "queue", f.Queue, "function", f.Name, "err", err)
					if errors.Is(err, contract.ErrInvalidQueueName) || errors.Is(err, queue.ErrNotAQueue) {
						have[f.Queue] = true // it will not become consumable: say so once
					}
					continue
				}
				have[f.Queue] = true
				w.mu.Lock()
				w.queues++
				w.mu.Unlock()
				w.cfg.Logger.Info("queue worker: consuming named queue", "queue", f.Queue, "stream", queue.Stream(f.Queue))
				start(f.Queue, c)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// depthSet is the consumers whose backlog the depth gauge reports.
type depthSet struct {
	mu sync.Mutex
	m  map[string]jetstream.Consumer
}

func (d *depthSet) set(m map[string]jetstream.Consumer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m = map[string]jetstream.Consumer{}
	for q, c := range m {
		d.m[q] = c
	}
}

func (d *depthSet) add(q string, c jetstream.Consumer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m[q] = c
}

func (d *depthSet) snapshot() map[string]jetstream.Consumer {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]jetstream.Consumer, len(d.m))
	for q, c := range d.m {
		out[q] = c
	}
	return out
}
