package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestQueueWorkerBadFlagsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--nats-url", ""}, want: "-nats-url"},
		{args: []string{"--gateway-url", "ftp://x"}, want: "-gateway-url"},
		{args: []string{"--max-inflight", "-3"}, want: "-max-inflight"},
		{args: []string{"--ack-wait", "1ms"}, want: "-ack-wait"},
		{args: []string{"--ack-wait", "soon"}, want: "-ack-wait"},
		{args: []string{"--order", "random"}, want: "-order"},
		{args: []string{"--queues", "a.b"}, want: "-queues"},
		{args: []string{"--max-attempts", "0"}, want: "-max-attempts"},
		{args: []string{"--retry-initial", "1s", "--retry-max", "10ms"}, want: "-retry-max"},
		{args: []string{"--metrics-addr", "nowhere"}, want: "-metrics-addr"},
		{args: []string{"--functions-url", "nope"}, want: "-functions-url"},
		{args: []string{"--basic-auth-user", "admin"}, want: "-basic-auth-password-file"},
		{args: []string{"--basic-auth-user", "admin", "--basic-auth-password-file", "/does/not/exist"}, want: "-basic-auth-password-file"},
		{args: []string{"--gpuserver-url", "http://a:1", "--gpuserver-socket", "/x"}, want: "-gpuserver-url"},
		{env: map[string]string{"FAAS_GPU_MAX_INFLIGHT": "many"}, want: "FAAS_GPU_MAX_INFLIGHT"},
		{env: map[string]string{"FAAS_GPU_ACK_WAIT": "1ms"}, want: "-ack-wait"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"faas-gpu", "queue-worker"}, tc.args...), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("%v %v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, tc.env, code, stderr.String(), tc.want)
			}
		})
	}
}
