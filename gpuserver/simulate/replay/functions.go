package replay

import (
	"embed"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
)

// Image is the image name every replayed function is deployed with: its build context is WriteBuildContext's.
const Image = "faas-gpu-replay-model:latest"

// imageDir is the build dir's folder of Image (provider/local.ImageDir: the name without its tag).
const imageDir = "faas-gpu-replay-model"

// Template is the template the model function runs on (template/<Template>/ of the templates dir).
const Template = "gpu-python"

// Environment of the model function (function/handler.py).
const (
	EnvModelBytes = "REPLAY_MODEL_BYTES"
	EnvExecNS     = "REPLAY_EXEC_NS"
	// EnvTiming makes the function time each request's phases in its process (Timing).
	EnvTiming = "REPLAY_TIMING"
)

// DeployOptions are what a replay may change in the functions' deployments.
type DeployOptions struct {
	// Scale are com.openfaas.scale.* labels (ParseScaleLabels); none: one instance.
	Scale map[string]string
	// Timing sets EnvTiming: each request's phases are timed in the function's process, answered to a request
	// with the query timing=1 (Timing).
	Timing bool
}

// Timing is one function process's phases of the requests it served (function/handler.py with EnvTiming), in
// milliseconds: the acquire's round trip to the gpuserver less the request's wait in its queue, the template's
// work between the acquire's answer and the handler, the launch (its remoted call), the synchronize (the kernel
// and the call's round trip), the template's work between the handler's end and the release, and the release's
// round trip.
type Timing struct {
	Requests         int         `json:"requests"`
	AcquireRoundTrip PhaseTiming `json:"acquire_round_trip"`
	TemplateBefore   PhaseTiming `json:"template_before"`
	Launch           PhaseTiming `json:"launch"`
	Synchronize      PhaseTiming `json:"synchronize"`
	TemplateAfter    PhaseTiming `json:"template_after"`
	ReleaseRoundTrip PhaseTiming `json:"release_round_trip"`
}

// PhaseTiming is one phase's mean, median and 90th percentile (ms).
type PhaseTiming struct {
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
}

//go:embed function
var functionFiles embed.FS

// Function is one function of a replay: its model as the simulator assigns it (round-robin over the model table,
// simulate.AssignRoundRobin), its SLO and memory quota as the simulator gives them.
type Function struct {
	// Name is the deployed function's name: the simulator's ("fn-0003-resnet50") with the characters OpenFaaS
	// refuses in a name replaced by '-'.
	Name       string
	Model      simulate.Model
	SLO        time.Duration
	Percentile float64
	// QuotaBytes is the function's GPU memory (com.openfaas.gpu.memory): its weights times the simulator's
	// memory factor, in whole MiB.
	QuotaBytes uint64
}

// Functions gives n functions their models as `faas-gpu sim` does by default: function i runs model i mod the
// table's length.
func Functions(models []simulate.Model, n int) ([]Function, error) {
	if len(models) == 0 || n <= 0 {
		return nil, fmt.Errorf("%w: needs models and at least one function", ErrInvalidWindow)
	}
	out := make([]Function, n)
	for i := range out {
		m := models[i%len(models)]
		f := Function{Name: fmt.Sprintf("fn-%04d-%s", i, dnsName(m.Name)), Model: m, SLO: m.SLO,
			Percentile: m.Percentile}
		if f.SLO == 0 {
			f.SLO = simulate.DefaultSLO
		}
		if f.Percentile == 0 {
			f.Percentile = contract.DefaultPercentile
		}
		f.QuotaBytes = uint64(math.Ceil(float64(m.WeightsBytes)*simulate.DefaultMemoryFactor/(1<<20))) << 20
		out[i] = f
	}
	return out, nil
}

// dnsName is s in lower case with every character but a-z, 0-9 and '-' replaced by '-'.
func dnsName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '-'
	}, s)
}

// Deployment is f's deployment: a GPU function (memory quota, SLO and percentile annotations) of the model
// function, whose model size and GPU time per request are f's model's weights and remoted execution time (what
// the simulator charges the faas-gpu policy), with the product's defaults for everything else: one instance
// without scaling labels unless scale gives com.openfaas.scale.* labels (ParseScaleLabels), which up's
// autoscaler then follows. timeScale is the timed virtual GPU's (up's --sim-time-scale, 1 in real time): every
// modelled duration takes that many times longer, so the SLO the gpuserver holds the function to is scaled with
// it.
func (f Function) Deployment(timeScale float64, opt DeployOptions) types.FunctionDeployment {
	labels := map[string]string{}
	for k, v := range opt.Scale {
		labels[k] = v
	}
	env := map[string]string{
		EnvModelBytes: strconv.FormatUint(f.Model.WeightsBytes, 10),
		EnvExecNS:     strconv.FormatInt(int64(f.Model.Remote), 10),
	}
	if opt.Timing {
		env[EnvTiming] = "1"
	}
	return types.FunctionDeployment{
		Service: f.Name, Image: Image, EnvProcess: "python3 index.py",
		EnvVars: env,
		Labels:  &labels,
		Annotations: &map[string]string{
			contract.AnnotationMemory:     strconv.FormatUint(f.QuotaBytes>>20, 10) + "Mi",
			contract.AnnotationSLO:        time.Duration(float64(f.SLO) * timeScale).String(),
			contract.AnnotationPercentile: strconv.FormatFloat(f.Percentile, 'f', -1, 64),
		},
	}
}

// WriteBuildContext writes the model function's build context into buildDir (buildDir/<the image's name>/, as
// faas-cli build --shrinkwrap lays it out): the template templatesDir/gpu-python with function/handler.py and
// its driver and kernel as the function folder.
func WriteBuildContext(templatesDir, buildDir string) error {
	handler, err := os.MkdirTemp("", "faas-gpu-replay-function")
	if err != nil {
		return fmt.Errorf("replay: build context: %w", err)
	}
	defer os.RemoveAll(handler)
	sub, err := fs.Sub(functionFiles, "function")
	if err != nil {
		return fmt.Errorf("replay: build context: %w", err)
	}
	if err := os.CopyFS(handler, sub); err != nil {
		return fmt.Errorf("replay: build context: %w", err)
	}
	tpl := filepath.Join(templatesDir, Template)
	if _, err := os.Stat(filepath.Join(tpl, "index.py")); err != nil {
		return fmt.Errorf("replay: template %s: %w (give the folder of templates, ./template of the repository)",
			tpl, err)
	}
	dst := filepath.Join(buildDir, imageDir)
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("replay: build context: %w", err)
	}
	if err := shrinkwrap.Assemble(tpl, handler, dst); err != nil {
		return fmt.Errorf("replay: build context: %w", err)
	}
	return nil
}
