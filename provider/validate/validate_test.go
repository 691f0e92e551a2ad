package validate

import (
	"errors"
	"strings"
	"testing"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
)

func TestDeploymentAcceptsWhatFaasCLISends(t *testing.T) {
	fd := types.FunctionDeployment{Service: "hello-gpu", Image: "ghcr.io/team/hello-gpu:0.1@sha256:abc",
		EnvProcess: "python3 index.py", EnvVars: map[string]string{"write_debug": "true", "MODEL.PATH": "/m",
			"A-B": strings.Repeat("x", 100<<10)},
		Labels:      &map[string]string{"com.openfaas.scale.min": "1"},
		Annotations: &map[string]string{"com.openfaas.gpu.memory": "1536Mi", "topic": "a\nb"},
		Secrets:     []string{"api-key"}, Constraints: []string{"node.platform.os == linux"},
		Limits: &types.FunctionResources{Memory: "1Gi", CPU: "500m"}}
	if err := Deployment(fd); err != nil {
		t.Fatal(err)
	}
	// Every form Kubernetes reads for memory, cpu and device counts.
	for _, r := range []types.FunctionResources{
		{Memory: "128Mi", CPU: "0.5"}, {Memory: "1.5Gi", CPU: "2"}, {Memory: "500M", CPU: "100m"},
		{Memory: "1e9", CPU: "1.25", NvidiaGPU: "1"}, {Memory: "2048", AmdGPU: "0", IntelGPU: "2"},
	} {
		fd.Limits, fd.Requests = &r, &r
		if err := Deployment(fd); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
}

// TestDeploymentRefusesWhatCanNeverStart pins the refusals: each names the field, wraps provider.ErrInvalid (400).
func TestDeploymentRefusesWhatCanNeverStart(t *testing.T) {
	base := func() types.FunctionDeployment {
		return types.FunctionDeployment{Service: "fn", Image: "fn:latest"}
	}
	many := map[string]string{}
	for i := 0; i < MaxEnvVars+1; i++ {
		many["V"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+strings.Repeat("1", i/182)] = "v"
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*types.FunctionDeployment)
		mention string
	}{
		{"NUL in an env value", func(fd *types.FunctionDeployment) { fd.EnvVars = map[string]string{"A": "x\x00y"} }, `envVars["A"]`},
		{"NUL in an env name", func(fd *types.FunctionDeployment) { fd.EnvVars = map[string]string{"A\x00B": "x"} }, "NUL"},
		{"= in an env name", func(fd *types.FunctionDeployment) { fd.EnvVars = map[string]string{"A=B": "x"} }, `envVars["A=B"]`},
		{"empty env name", func(fd *types.FunctionDeployment) { fd.EnvVars = map[string]string{"": "x"} }, "envVars"},
		{"env name with a space", func(fd *types.FunctionDeployment) { fd.EnvVars = map[string]string{"A B": "x"} }, `envVars["A B"]`},
		{"env name starting with a digit", func(fd *types.FunctionDeployment) { fd.EnvVars = map[string]string{"1A": "x"} }, `envVars["1A"]`},
		{"900 KB env value", func(fd *types.FunctionDeployment) {
			fd.EnvVars = map[string]string{"BIG": strings.Repeat("x", 900<<10)}
		}, `envVars["BIG"]`},
		{"too much environment in all", func(fd *types.FunctionDeployment) {
			fd.EnvVars = map[string]string{}
			for i := 0; i < 3; i++ {
				fd.EnvVars[string(rune('A'+i))] = strings.Repeat("x", 100<<10)
			}
		}, "envVars"},
		{"too many env vars", func(fd *types.FunctionDeployment) { fd.EnvVars = many }, "envVars"},
		{"NUL in envProcess", func(fd *types.FunctionDeployment) { fd.EnvProcess = "python3\x00 index.py" }, "envProcess"},
		{"blank envProcess", func(fd *types.FunctionDeployment) { fd.EnvProcess = "   " }, "envProcess"},
		{"huge envProcess", func(fd *types.FunctionDeployment) { fd.EnvProcess = strings.Repeat("x", MaxEnvProcess+1) }, "envProcess"},
		{"newline in the image", func(fd *types.FunctionDeployment) { fd.Image = "fn\n:latest" }, "image"},
		{"space in the image", func(fd *types.FunctionDeployment) { fd.Image = "fn :latest" }, "image"},
		{"bad service", func(fd *types.FunctionDeployment) { fd.Service = "Fn_1" }, "service"},
		{"long service", func(fd *types.FunctionDeployment) { fd.Service = strings.Repeat("a", 64) }, "service"},
		{"NUL in an annotation", func(fd *types.FunctionDeployment) {
			fd.Annotations = &map[string]string{"a": "\x00"}
		}, `annotations["a"]`},
		{"huge label key", func(fd *types.FunctionDeployment) {
			fd.Labels = &map[string]string{strings.Repeat("k", MaxMetaKey+1): "v"}
		}, "labels"},
		{"bad secret", func(fd *types.FunctionDeployment) { fd.Secrets = []string{"../etc"} }, "secrets"},
		{"control character in a constraint", func(fd *types.FunctionDeployment) { fd.Constraints = []string{"a\x1bb"} }, "constraints[0]"},
		{"huge limit", func(fd *types.FunctionDeployment) {
			fd.Limits = &types.FunctionResources{Memory: strings.Repeat("9", MaxResource+1)}
		}, "limits.memory"},
		{"memory limit that is no quantity", func(fd *types.FunctionDeployment) {
			fd.Limits = &types.FunctionResources{Memory: "lots"}
		}, `limits.memory: "lots" is not a quantity`},
		{"memory request of milli-bytes", func(fd *types.FunctionDeployment) {
			fd.Requests = &types.FunctionResources{Memory: "100m"}
		}, "requests.memory"},
		{"negative memory request", func(fd *types.FunctionDeployment) {
			fd.Requests = &types.FunctionResources{Memory: "-1Gi"}
		}, "requests.memory"},
		{"cpu limit that is no quantity", func(fd *types.FunctionDeployment) {
			fd.Limits = &types.FunctionResources{CPU: "fast"}
		}, `limits.cpu: "fast" is not a CPU quantity`},
		{"zero cpu request", func(fd *types.FunctionDeployment) { fd.Requests = &types.FunctionResources{CPU: "0"} }, "requests.cpu"},
		{"cpu with a unit", func(fd *types.FunctionDeployment) { fd.Limits = &types.FunctionResources{CPU: "1Gi"} }, "limits.cpu"},
		{"gpu count that is no number", func(fd *types.FunctionDeployment) {
			fd.Limits = &types.FunctionResources{NvidiaGPU: "one"}
		}, "limits.nvidia.com/gpu"},
	} {
		fd := base()
		tc.mutate(&fd)
		err := Deployment(fd)
		if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("%s: %v, want ErrInvalid naming %s", tc.name, err, tc.mention)
		}
		if err != nil && len(err.Error()) > 400 {
			t.Errorf("%s: the message is %d bytes; values must be clipped", tc.name, len(err.Error()))
		}
	}
}
