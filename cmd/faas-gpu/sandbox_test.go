package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
)

func TestMain(m *testing.M) {
	if sandbox.IsInit() { // a function sandbox's init: this test binary started again by an in-process provider
		os.Exit(sandbox.RunInit())
	}
	os.Exit(m.Run())
}

// TestSandboxFlagsExitTwoNamingTheFlag: a bad value of the sandbox's, the connection limits' or the streams'
// limits' flags stops up, provider and queue-worker before anything starts, with exit 2 and the flag's name.
func TestSandboxFlagsExitTwoNamingTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"faas-gpu", "up", "--sandbox", "maybe"}, "-sandbox"},
		{[]string{"faas-gpu", "up", "--sandbox-ids", "10"}, "-sandbox-ids"},
		{[]string{"faas-gpu", "up", "--sandbox-ids", "0:100"}, "-sandbox-ids"},
		{[]string{"faas-gpu", "up", "--sandbox-ids", "4294967000:65536"}, "-sandbox-ids"},
		{[]string{"faas-gpu", "provider", "--sandbox", "yes"}, "-sandbox"},
		{[]string{"faas-gpu", "up", "--max-conns", "-1"}, "-max-conns"},
		{[]string{"faas-gpu", "up", "--max-conns", "10", "--max-conns-per-peer", "20"}, "-max-conns-per-peer"},
		{[]string{"faas-gpu", "provider", "--max-conns-per-peer", "-3"}, "-max-conns-per-peer"},
		{[]string{"faas-gpu", "up", "--queue-max-bytes", "1Ki"}, "-queue-max-bytes"},
		{[]string{"faas-gpu", "up", "--dead-letter-max-bytes", "lots"}, "-dead-letter-max-bytes"},
		{[]string{"faas-gpu", "queue-worker", "--dead-letter-max-bytes", "1Mi"}, "-dead-letter-max-bytes"},
		{[]string{"faas-gpu", "queue-worker", "--queue-max-age", "-1h"}, "-queue-max-age"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming %s", tc.args, code, stderr.String(), tc.want)
		}
	}
}
