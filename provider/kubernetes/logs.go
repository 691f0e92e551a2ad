package kubernetes

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/openfaas/faas-provider/logs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Logs streams the function container's output from each of its running pods (or the one named by req.Instance).
// Every stream is opened before Logs returns, so an API error is returned, not lost; the channel closes when every
// stream has ended (no follow) or ctx ends.
func (b *Backend) Logs(ctx context.Context, req logs.Request) (<-chan logs.Message, error) {
	ns, err := b.target(req.Namespace, req.Name)
	if err != nil {
		return nil, err
	}
	if req.Tail < 0 {
		return nil, invalid("tail", "%d is negative", req.Tail)
	}
	pods, err := b.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelFunction + "=" + req.Name})
	if err != nil {
		return nil, APIError("list pods of "+req.Name, err)
	}
	opts := &corev1.PodLogOptions{Container: req.Name, Follow: req.Follow, Timestamps: true}
	if req.Tail > 0 {
		tail := int64(req.Tail)
		opts.TailLines = &tail
	}
	if req.Since != nil {
		opts.SinceTime = &metav1.Time{Time: *req.Since}
	}

	var streams []io.ReadCloser
	var names []string
	closeAll := func() {
		for _, s := range streams {
			s.Close()
		}
	}
	for _, p := range pods.Items {
		if req.Instance != "" && p.Name != req.Instance {
			continue
		}
		if p.Status.Phase == corev1.PodPending { // no container has started: no log yet
			continue
		}
		s, err := b.client.CoreV1().Pods(ns).GetLogs(p.Name, opts).Stream(ctx)
		if err != nil {
			closeAll()
			return nil, APIError(fmt.Sprintf("logs of pod %s", p.Name), err)
		}
		streams = append(streams, s)
		names = append(names, p.Name)
	}

	out := make(chan logs.Message)
	var wg sync.WaitGroup
	for i, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			readLog(ctx, s, logs.Message{Name: req.Name, Namespace: ns, Instance: names[i]}, out)
		}()
	}
	// Ending ctx unblocks every reader: the streams are tied to ctx, and sends select on ctx.Done.
	go func() {
		wg.Wait()
		close(out)
	}()
	return out, nil
}

// readLog sends one message per line of r; lines start with the RFC 3339 timestamp Kubernetes adds.
func readLog(ctx context.Context, r io.Reader, base logs.Message, out chan<- logs.Message) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		m := base
		m.Text = sc.Text()
		if ts, text, ok := strings.Cut(m.Text, " "); ok {
			if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
				m.Timestamp, m.Text = t, text
			}
		}
		select {
		case out <- m:
		case <-ctx.Done():
			return
		}
	}
}
