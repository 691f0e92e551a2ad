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

// TestSandboxFlagsExitTwoNamingTheFlag: a bad -sandbox or -sandbox-ids value stops up and provider before
// anything starts, with exit 2 and the flag's name.
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
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming %s", tc.args, code, stderr.String(), tc.want)
		}
	}
}
