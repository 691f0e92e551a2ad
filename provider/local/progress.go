package local

import (
	"strings"
	"sync/atomic"
)

// Progress of a function's preparation, where a newcomer looks for it: every line of pip's output is in the
// function's log (`faas-cli logs`), the lines that say what is downloading and how far it got (bytes, percent; see
// venv's progress filter) also go to the backend's log (the output of `faas-gpu up`), and the latest of them is in
// the function's status while it installs (StatusAnnotation, `faas-cli describe`).

// installProgress is the latest progress line of an install, read by the function's status.
type installProgress struct{ last atomic.Pointer[string] }

func (p *installProgress) set(text string) { p.last.Store(&text) }

func (p *installProgress) get() string {
	if s := p.last.Load(); s != nil {
		return *s
	}
	return ""
}

// progressLine says whether a line of pip's output (without the "pip: " prefix) tells how an install advances:
// a download starting or advancing, the packages being installed, the end.
func progressLine(text string) bool {
	for _, prefix := range []string{"Downloading ", "Installing collected packages", "Successfully installed"} {
		if strings.HasPrefix(strings.TrimSpace(text), prefix) {
			return true
		}
	}
	return false
}
