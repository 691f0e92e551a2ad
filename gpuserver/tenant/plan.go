package tenant

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
)

// addressPlan gives each tenant a slot: its address window (docs/tenants.md) and its repository directory. Slots
// are kept in <repository>/tenants.json, so that a tenant finds its images at their addresses after a restart of
// its executor or of the gpuserver.
type addressPlan struct {
	path     string
	base     uint64
	size     uint64
	maxSlots int

	mu    sync.Mutex
	slots map[string]int
}

// planFile is the plan's file format.
type planFile struct {
	Version    int            `json:"version"`
	WindowBase uint64         `json:"window_base"`
	WindowSize uint64         `json:"window_size"`
	Slots      map[string]int `json:"slots"`
}

func openPlan(dir string, base, size uint64, maxSlots int) (*addressPlan, error) {
	p := &addressPlan{path: filepath.Join(dir, "tenants.json"), base: base, size: size, maxSlots: maxSlots,
		slots: map[string]int{}}
	raw, err := os.ReadFile(p.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return p, nil
	case err != nil:
		return nil, fmt.Errorf("tenant address plan: %w", err)
	}
	var f planFile
	if err := json.Unmarshal(raw, &f); err != nil || f.Version != 1 {
		return nil, fmt.Errorf("tenant address plan %s: unreadable (%v): move it aside to start afresh (the "+
			"tenants' images are then initialised again)", p.path, err)
	}
	if f.WindowBase != base || f.WindowSize != size {
		// Another window layout: the old slots' images are at addresses of that layout; keep them by keeping the
		// layout they were made with.
		p.base, p.size = f.WindowBase, f.WindowSize
	}
	for t, s := range f.Slots {
		if s >= 0 && s < maxSlots {
			p.slots[t] = s
		}
	}
	return p, nil
}

// slot returns tenant's slot, assigning the lowest free one (and saving the plan).
func (p *addressPlan) slot(tenant string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.slots[tenant]; ok {
		return s, nil
	}
	used := make(map[int]bool, len(p.slots))
	for _, s := range p.slots {
		used[s] = true
	}
	for s := 0; s < p.maxSlots; s++ {
		if !used[s] {
			p.slots[tenant] = s
			if err := p.saveLocked(); err != nil {
				delete(p.slots, tenant)
				return 0, err
			}
			return s, nil
		}
	}
	return 0, fmt.Errorf("tenant address plan: all %d slots are taken", p.maxSlots)
}

// window is the address window of a slot: slot 0 starts one window above the base, which the gpuserver's own
// reservations use.
func (p *addressPlan) window(slot int) (base, size uint64) {
	return p.base + uint64(slot+1)*p.size, p.size
}

func (p *addressPlan) saveLocked() error {
	raw, err := json.MarshalIndent(planFile{Version: 1, WindowBase: p.base, WindowSize: p.size, Slots: p.slots}, "", "  ")
	if err != nil {
		return err
	}
	tmp := p.path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return fmt.Errorf("tenant address plan: %w", err)
	}
	if err := os.Rename(tmp, p.path); err != nil {
		return fmt.Errorf("tenant address plan: %w", err)
	}
	return nil
}

var safeDir = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,200}$`)

// dirName is a tenant's repository directory name: "namespace/team-a" -> "namespace-team-a".
func dirName(tenant string) string {
	for i := 0; i < len(tenant); i++ {
		if tenant[i] == '/' {
			if s := tenant[:i] + "-" + tenant[i+1:]; safeDir.MatchString(s) {
				return s
			}
			break
		}
	}
	return fmt.Sprintf("x-%x", tenant)
}
