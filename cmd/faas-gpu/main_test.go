package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestBadFlagsExitTwoNamingTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"nope"}, want: `unknown command "nope"`},
		{args: []string{"up", "--port", "0"}, want: "-port 0"},
		{args: []string{"up", "--port", "eighty"}, want: "-port"},
		{args: []string{"up", "--max-inflight", "-1"}, want: "-max-inflight"},
		{args: []string{"up", "--gpus", "v100x99"}, want: "-gpus"},
		{args: []string{"gpuserver", "--gpu-memory", "lots"}, want: "-gpu-memory"},
		{args: []string{"gpuserver", "--log-level", "loud"}, want: "-log-level"},
		{args: []string{"up", "--policy", "best"}, want: "-policy"},
		{args: []string{"up", "--env-max-age", "-1h"}, want: "-env-max-age"},
		{args: []string{"up", "--scale-down-window", "-1s"}, want: "-scale-down-window"},
		{args: []string{"up", "--autoscale-interval", "0s"}, want: "-autoscale-interval"},
		{args: []string{"gpuserver", "extra"}, want: `unexpected argument "extra"`},
		{args: []string{"up"}, env: map[string]string{"FAAS_GPU_PORT": "x"}, want: "FAAS_GPU_PORT"},
		{args: []string{"up"}, env: map[string]string{"FAAS_GPU_ENV_MAX_AGE": "often", "FAAS_GPU_PORT": ""}, want: "FAAS_GPU_ENV_MAX_AGE"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"faas-gpu"}, tc.args...), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestVersionAndHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"faas-gpu", "version"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "faas-gpu") {
		t.Fatalf("version: exit %d, %q %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"faas-gpu"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "commands:") {
		t.Fatalf("no command: exit %d, %q", code, stderr.String())
	}
}

func TestFaasNetesNameRunsTheProvider(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"/home/app/faas-netes", "--definitely-not-a-flag"}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "faas-gpu provider") {
		t.Fatalf("faas-netes: exit %d, stderr %q; want the provider command's flag error", code, stderr.String())
	}
}
