package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"

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
			reason := ReasonCallbackFailed
			if errors.Is(err, errCallbackRefused) {
				reason = ReasonCallbackRefused
			}
			if out.reason == "" {
				out.reason, out.detail = reason, err.Error()
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
		if errors.Is(err, errCallbackRefused) {
			return err // the address will not change: no retry
		}
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
	res, err := w.callbacks.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10)) // let a small answer's connection be reused
	_ = res.Body.Close()
	return res.StatusCode, nil
}

// deadLetter stores the message on the dead-letter stream with the reason. The entry is the queue request without
// the client's credentials (Authorization, Proxy-Authorization and Cookie headers removed) and, when
// DeadLetterDropBodies is set or the entry would not fit the NATS max_payload, without its body. A message that is
// not a queue request is not kept at all (its headers cannot be cleaned): the entry holds its size and the reason.
func (w *Worker) deadLetter(ctx context.Context, js jetstream.JetStream, m *message, reason, detail string) error {
	dl := &nats.Msg{Subject: queue.DeadLetterSubject(m.queue), Header: nats.Header{}}
	dl.Header.Set(queue.HeaderDeadLetterReason, reason+": "+detail)
	dl.Header.Set(queue.HeaderDeadLetterQueue, m.queue)
	if m.req.Function != "" {
		dl.Header.Set(queue.HeaderDeadLetterFunction, m.req.Function)
	}
	dl.Header.Set(queue.HeaderDeadLetterDeliveries, strconv.Itoa(m.delivery))
	dl.Header.Set(queue.HeaderDeadLetterSequence, strconv.FormatUint(m.seq, 10))
	dl.Header.Set(queue.HeaderDeadLetterSize, strconv.Itoa(len(m.msg.Data())))
	if m.callID != "" {
		dl.Header.Set(queue.HeaderCallID, m.callID)
	}
	var dropped []string
	if !m.parsed {
		dropped = append(dropped, "message")
	} else {
		req := m.req
		req.Header = queue.WithoutCredentials(req.Header)
		if w.cfg.DeadLetterDropBodies {
			req.Body, dropped = nil, append(dropped, "body")
		}
		data, err := encodeRequest(req)
		if err != nil {
			return fmt.Errorf("dead letter: encoding the request: %w", err)
		}
		if nc := js.Conn(); nc != nil && nc.MaxPayload() > 0 && int64(len(data)+4096) > nc.MaxPayload() && req.Body != nil {
			req.Body, dropped = nil, append(dropped, "body")
			if data, err = encodeRequest(req); err != nil {
				return fmt.Errorf("dead letter: encoding the request: %w", err)
			}
		}
		dl.Data = data
	}
	if len(dropped) > 0 {
		dl.Header.Set(queue.HeaderDeadLetterDropped, strings.Join(dropped, ","))
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(pctx, dl); err != nil {
		return fmt.Errorf("dead letter to %s: %w", queue.DeadLetterStream, err)
	}
	return nil
}

// encodeRequest is the JSON of a queue request, without HTML escaping (as the front door writes it).
func encodeRequest(req types.QueueRequest) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
