package simulate

import (
	_ "embed"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
)

// Co-running in the simulator: when the controller (controller.Config.Sharing, the product's code)
// binds a request of a function that asked for a compute share beside another binding on a GPU, the simulator runs
// both at once, each progressing at the rate its share gives it (processor sharing by granted share, shareexec.go).
// Four policies side by side (SharePolicy): exclusive (no function asks: today), static shares (HAMi-like: each
// binding's share is its request, fixed, also when alone), gShare's time slices (a quota tied to the memory quota,
// the GPU whole for the binding's slice of each 20 ms round: a fluid approximation of the round robin) and Dilu
// (each binding's share moved between request and limit by gpuserver/compute's arbiter, the product's four-state
// controller, ticked every period of the virtual clock).
//
// # The latency-against-share model (an ASSUMPTION until the GPU suite measures it)
//
// A model's kernels keep a fraction u of the GPU's compute busy at batch 1 (shareprofile.csv, ShareProfile.U), so
// that with a share s of the GPU (spatial: Dilu's tokens and HAMi's core limit) a request takes
//
//	latency(s) = t_exclusive * max(1, u / s) * (1 + slowdown while another binding runs on the GPU)
//
// and with a time slice q of the GPU (gShare: the whole GPU for q of each round) t_exclusive / q, times the same
// slowdown. The slowdown (Sharing.Slowdown, DefaultCoLocationSlowdown) stands for what co-located kernels cost each
// other beyond the share (memory bandwidth, caches). nwire's timed virtual GPU (gpuserver/device/sim) models
// co-running on the device; where its slowdown model differs, docs/bench/sharing.md says so.
//
// # Which functions ask for shares (the benchmark's rule, as a user following Dilu's profile would set them)
//
// Every function whose model has a profile row asks for request = u/2 rounded up to 0.1 (its latency at the request
// at most twice its exclusive one) and limit = u rounded up to 0.1 (beyond u the model gains nothing); static shares
// set the one number HAMi has, the request; gShare's quota is the larger of the function's memory quota over the
// GPU's memory and that request (gShare ties compute to memory: a user buys the memory that carries the compute it
// needs).

// SharePolicy is how co-located bindings share a GPU's compute (Config.Sharing).
type SharePolicy string

// The sharing policies.
const (
	ShareExclusive SharePolicy = "exclusive" // no function asks for a share: a GPU runs one request at a time
	ShareStatic    SharePolicy = "static"    // HAMi-like: share = request, fixed
	ShareGShare    SharePolicy = "gshare"    // gShare: a time slice tied to the memory quota
	ShareDilu      SharePolicy = "dilu"      // Dilu: request/limit, vertical scaling by gpuserver/compute
)

// SharePolicies lists the sharing policies.
func SharePolicies() []SharePolicy {
	return []SharePolicy{ShareExclusive, ShareStatic, ShareGShare, ShareDilu}
}

// ParseSharePolicy reads a sharing policy ("" is exclusive).
func ParseSharePolicy(s string) (SharePolicy, error) {
	if s == "" {
		return ShareExclusive, nil
	}
	for _, p := range SharePolicies() {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: sharing policy %q (want exclusive, static, gshare or dilu)", ErrInvalidInput, s)
}

// DefaultCoLocationSlowdown is what a co-located binding costs each other one beyond its share (assumed: 10%).
const DefaultCoLocationSlowdown = 0.1

// GShareRound is gShare's round-robin period (its 20 ms); the simulator runs its slices as a fluid share of it.
const GShareRound = 20 * time.Millisecond

// Sharing configures co-running (Config.Sharing). The zero value is exclusive: nothing changes.
type Sharing struct {
	Policy SharePolicy
	// Profile is the latency-against-share profile per model name (DefaultShareProfile when nil); a function
	// whose model has no row never asks for a share.
	Profile map[string]ShareProfile
	// Slowdown is the co-location slowdown (DefaultCoLocationSlowdown when 0; negative: none).
	Slowdown float64
	// Period is Dilu's arbiter period (compute.DefaultPeriod when 0).
	Period time.Duration
}

// On reports whether functions ask for shares.
func (s Sharing) On() bool { return s.Policy != "" && s.Policy != ShareExclusive }

func (s Sharing) slowdown() float64 {
	switch {
	case s.Slowdown < 0:
		return 0
	case s.Slowdown == 0:
		return DefaultCoLocationSlowdown
	}
	return s.Slowdown
}

func (s Sharing) check() error {
	if _, err := ParseSharePolicy(string(s.Policy)); err != nil {
		return err
	}
	for name, p := range s.Profile {
		if !(p.U > 0 && p.U <= 1) {
			return fmt.Errorf("%w: share profile of %s: u %v must be in (0, 1]", ErrInvalidInput, name, p.U)
		}
	}
	if s.Period < 0 {
		return fmt.Errorf("%w: sharing period %v", ErrInvalidInput, s.Period)
	}
	return nil
}

// controller is the controller's sharing setting: on with Dilu's caps (requests <= 1, limits <= 1.5).
func (s Sharing) controller() controller.Sharing {
	return controller.Sharing{On: s.On()}
}

// ShareProfile is one model's latency against its share (an assumption until measured: shareprofile.csv).
type ShareProfile struct {
	// U is the fraction of the GPU's compute the model's kernels keep busy at batch 1.
	U float64
}

// Request is the share the benchmark's functions of this model ask for: u/2 rounded up to 0.1.
func (p ShareProfile) Request() float64 { return ceilTenth(p.U / 2) }

// Limit is the most the benchmark's functions of this model ask for: u rounded up to 0.1.
func (p ShareProfile) Limit() float64 { return ceilTenth(p.U) }

// Speed is the rate at which a request progresses with a spatial share s of the GPU: min(1, s/u).
func (p ShareProfile) Speed(s float64) float64 { return min(1, s/p.U) }

func ceilTenth(v float64) float64 {
	return max(0.1, min(1, math.Ceil(v*10-1e-9)/10))
}

//go:embed shareprofile.csv
var shareProfileCSV string

// DefaultShareProfile is the simulator's assumed profile (shareprofile.csv).
func DefaultShareProfile() map[string]ShareProfile {
	p, err := ParseShareProfile(strings.NewReader(shareProfileCSV))
	if err != nil {
		panic(err) // the embedded file is checked by the tests
	}
	return p
}

// ParseShareProfile reads a profile: a header "model,u", then a row per model; lines starting with # are comments.
func ParseShareProfile(r io.Reader) (map[string]ShareProfile, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	rows, err := cr.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%w: share profile: %w", ErrInvalidInput, err)
	}
	if len(rows) == 0 || len(rows[0]) < 2 || rows[0][0] != "model" || rows[0][1] != "u" {
		return nil, fmt.Errorf("%w: share profile: want the header model,u", ErrInvalidInput)
	}
	out := map[string]ShareProfile{}
	for _, row := range rows[1:] {
		u, err := strconv.ParseFloat(row[1], 64)
		if err != nil || !(u > 0 && u <= 1) {
			return nil, fmt.Errorf("%w: share profile: %s: u %q must be in (0, 1]", ErrInvalidInput, row[0], row[1])
		}
		out[row[0]] = ShareProfile{U: u}
	}
	return out, nil
}

// shareOf is function fi's shares under the run's policy: ok false when it does not ask (exclusive).
func (e *engine) shareOf(fi int) (request, limit float64, p ShareProfile, ok bool) {
	s := e.cfg.Sharing
	if !s.On() {
		return 0, 0, ShareProfile{}, false
	}
	m := e.fns[fi].model
	p, ok = s.Profile[m.Name]
	if !ok {
		return 0, 0, ShareProfile{}, false
	}
	request, limit = p.Request(), p.Limit()
	switch s.Policy {
	case ShareStatic:
		limit = request
	case ShareGShare:
		mem := 0.0
		if len(e.cfg.Node.GPUs) > 0 && e.cfg.Node.GPUs[0].MemoryBytes > 0 {
			mem = float64(e.cfg.quota(m.WeightsBytes)) / float64(e.cfg.Node.GPUs[0].MemoryBytes)
		}
		request = max(request, math.Ceil(mem*100-1e-9)/100)
		limit = request
	}
	if request >= 1 {
		return 0, 0, ShareProfile{}, false
	}
	return request, limit, p, true
}

// shareSpec gives function fi's spec its compute shares (pool.FunctionSpec.ComputeRequest and .ComputeLimit).
func (e *engine) shareSpec(fi int, spec *controller.Function) {
	if req, lim, _, ok := e.shareOf(fi); ok {
		spec.ComputeRequest, spec.ComputeLimit = req, lim
	}
}
