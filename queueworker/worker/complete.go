package worker

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// outcome is the final result of one message.
type outcome struct {
	status   int // the function's HTTP status; 0 when nothing was invoked and there is no status to report
	header   http.Header
	body     []byte
	duration time.Duration
	err      error // transport error of the last attempt
	// reason, when set, sends the message to the dead letters (one of the Reason constants), detail says more.
	reason, detail string
}

// complete finishes a message: callback (when the call names one), dead letter (when the outcome says so), ack.
// A message whose dead-letter entry cannot be written is nakked with a delay and comes back.
func (w *Worker) complete(ctx context.Context, js jetstream.JetStream, m *message, out outcome) {
	defer w.release(m)
	if m.req.CallbackURL != nil && out.status != 0 {
		if err := w.callback(ctx, m, out); err != nil {
			w.m.callbacks.WithLabelValues("failed").Inc()
			w.cfg.Logger.Error("queue worker: callback failed; dead-lettering", "function", m.req.Function,
				"request_id", m.callID, "callback", m.req.CallbackURL.Redacted(), "err", err)
			if out.reason == "" {
				out.reason, out.detail = ReasonCallbackFailed, err.Error()
			} else {
				out.detail += "; callback failed too: " + err.Error()
			}
		}
	}
	if out.reason != "" {
		if err := w.deadLetter(ctx, js, m, out.reason, out.detail); err != nil {
			w.cfg.Logger.Error("queue worker: writing dead letter failed; message comes back", "function", m.req.Function,
				"request_id", m.callID, "reason", out.reason, "err", err)
			_ = m.msg.NakWithDelay(time.Second)
			return
		}
		w.m.deadLetters.WithLabelValues(m.queue, out.reason).Inc()
		w.cfg.Logger.Warn("queue worker: message dead-lettered", "function", m.req.Function, "request_id", m.callID,
			"queue", m.queue, "reason", out.reason, "detail", out.detail)
	}
	if err := m.msg.Ack(); err != nil {
		w.cfg.Logger.Warn("queue worker: ack failed; the message will be delivered again", "function", m.req.Function,
			"request_id", m.callID, "err", err)
	}
}

// callback POSTs the outcome to the call's X-Callback-Url, retrying network errors, 408, 429 and 5xx.
func (w *Worker) callback(ctx context.Context, m *message, out outcome) error {
	var last error
	for k := 0; k < w.cfg.CallbackRetry.MaxAttempts; k++ {
		if k > 0 {
			w.m.callbacks.WithLabelValues("retried").Inc()
			if !sleep(ctx, w.cfg.CallbackRetry.Backoff(k-1)) {
				return fmt.Errorf("callback abandoned at shutdown after %d attempts: %w", k, last)
			}
		}
		status, err := w.postCallback(ctx, m, out)
		if err == nil && status >= 200 && status < 300 {
			w.m.callbacks.WithLabelValues("ok").Inc()
			return nil
		}
		if err == nil {
			last = fmt.Errorf("callback answered %d", status)
			if status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests {
				return last
			}
		} else {
			last = err
		}
	}
	return fmt.Errorf("%d attempts: %w", w.cfg.CallbackRetry.MaxAttempts, last)
}

func (w *Worker) postCallback(ctx context.Context, m *message, out outcome) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, w.cfg.CallbackTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, m.req.CallbackURL.String(), bytes.NewReader(out.body))
	if err != nil {
		return 0, fmt.Errorf("callback request: %w", err)
	}
	for k, vs := range out.header {
		req.Header[k] = slices.Clone(vs)
	}
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	req.Header.Set(queue.HeaderCallID, m.callID)
	req.Header.Set(queue.HeaderFunctionStatus, strconv.Itoa(out.status))
	req.Header.Set(queue.HeaderFunctionName, m.req.Function)
	req.Header.Set(queue.HeaderDurationSeconds, strconv.FormatFloat(out.duration.Seconds(), 'f', 6, 64))
	req.Header.Set(queue.HeaderRetry, strconv.Itoa(m.delivery-1))
	req.Header.Set(queue.HeaderRetryMax, strconv.Itoa(w.cfg.Retry.MaxAttempts-1))
	if st := m.req.Header.Get(queue.HeaderStartTime); st != "" {
		req.Header.Set(queue.HeaderStartTime, st)
	}
	res, err := w.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	_ = res.Body.Close()
	return res.StatusCode, nil
}

// deadLetter stores the message on the dead-letter stream with the reason.
func (w *Worker) deadLetter(ctx context.Context, js jetstream.JetStream, m *message, reason, detail string) error {
	dl := &nats.Msg{Subject: queue.DeadLetterSubject(m.queue), Data: m.msg.Data(), Header: nats.Header{}}
	dl.Header.Set(queue.HeaderDeadLetterReason, reason+": "+detail)
	dl.Header.Set(queue.HeaderDeadLetterQueue, m.queue)
	if m.req.Function != "" {
		dl.Header.Set(queue.HeaderDeadLetterFunction, m.req.Function)
	}
	dl.Header.Set(queue.HeaderDeadLetterDeliveries, strconv.Itoa(m.delivery))
	dl.Header.Set(queue.HeaderDeadLetterSequence, strconv.FormatUint(m.seq, 10))
	if m.callID != "" {
		dl.Header.Set(queue.HeaderCallID, m.callID)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(pctx, dl); err != nil {
		return fmt.Errorf("dead letter to %s: %w", queue.DeadLetterStream, err)
	}
	return nil
}
