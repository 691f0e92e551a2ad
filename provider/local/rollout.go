package local

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// A rolling update that cannot finish is visible: while the replicas of a new definition are not ready the
// previous definition's ready replicas keep serving (Update), and the function's status says so in
// StatusAnnotation (`faas-cli describe`, the list's JSON): that the new definition is starting, or that its
// replicas exit before they are ready and how the last one ended (its exit status and its last line of output), and
// which image still serves. The backend's log says it once per update. A later update rolls forward: its replicas
// replace the failed ones at once and the previous definition's retire once they are ready.

// rollout is the state of a rolling update; fields are guarded by Backend.mu.
type rollout struct {
	// previousImage is the image the retiring replicas run; "" when no update is rolling.
	previousImage string
	// reported: the backend's log said that this update's replicas fail.
	reported bool
}

// startRolloutLocked records an update from prev's definition once its ready replicas are retiring; b.mu is held.
// An update while another rolls keeps the image that serves.
func (fn *function) startRolloutLocked(prev record) {
	if len(fn.retiring) == 0 {
		fn.rollout = rollout{}
		return
	}
	if fn.rollout.previousImage == "" {
		fn.rollout.previousImage = prev.Deployment.Image
	}
	fn.rollout.reported = false
}

// endRolloutLocked forgets the update once the previous definition's replicas have retired; b.mu is held.
func (fn *function) endRolloutLocked() { fn.rollout = rollout{} }

// rolloutFailedLocked is called when a replica of the current definition exited before it was ready; b.mu is held.
func (b *Backend) rolloutFailedLocked(fn *function, err error) {
	if fn.rollout.previousImage == "" || fn.rollout.reported {
		return
	}
	fn.rollout.reported = true
	fn.event("", "the update to image %s is not ready: a replica %v; the previous definition (image %s) keeps serving "+
		"until an update's replicas are ready", fn.rec.Deployment.Image, err, fn.rollout.previousImage)
	b.log.Warn("function update is not ready; the previous definition keeps serving", "function", fn.name,
		"image", fn.rec.Deployment.Image, "serving_image", fn.rollout.previousImage, "err", err)
}

// replicaStateLocked describes a function's replicas for StatusAnnotation: a rolling update, replicas that keep
// exiting before they are ready, or replicas still starting; "" when a replica serves. b.mu is held.
func (fn *function) replicaStateLocked() string {
	failing := fn.startFailures > 0 && fn.lastFailure != nil
	switch {
	case fn.rollout.previousImage != "" && failing:
		return fmt.Sprintf("update not ready: the replicas of image %s exit before they are ready (last: %v); "+
			"the previous definition (image %s) keeps serving; fix the function and deploy it again (see the "+
			"function's logs)", fn.rec.Deployment.Image, fn.lastFailure, fn.rollout.previousImage)
	case fn.rollout.previousImage != "":
		return fmt.Sprintf("updating: the replicas of image %s are starting; the previous definition (image %s) "+
			"serves until they are ready", fn.rec.Deployment.Image, fn.rollout.previousImage)
	case failing && fn.rec.Replicas > 0 && fn.readyLocked() == 0:
		return fmt.Sprintf("not ready: its replicas exit before they are ready (last: %v; see the function's logs)",
			fn.lastFailure)
	case fn.rec.Replicas > 0 && fn.readyLocked() == 0:
		// Importing a framework takes a while (PyTorch: a minute on a busy machine); say so instead of nothing.
		return fmt.Sprintf("starting: %d replica(s), none ready yet (see the function's logs)", fn.rec.Replicas)
	}
	return ""
}

// readyLocked counts the ready replicas, retiring ones included.
func (fn *function) readyLocked() uint64 {
	n := uint64(0)
	for _, r := range fn.allReplicas() {
		if r.readyURL() != nil {
			n++
		}
	}
	return n
}

// lastLine keeps the last line a process wrote, so that the error of one that exits before it is ready says why in
// its own words (a Python traceback ends with the exception).
type lastLine struct {
	mu   sync.Mutex
	text string
}

const lastLineMax = 240

func (l *lastLine) set(text string) {
	text = strings.TrimSpace(text)
	if text == "" {
		return
	}
	if len(text) > lastLineMax {
		cut := lastLineMax
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + "..."
	}
	l.mu.Lock()
	l.text = text
	l.mu.Unlock()
}

// suffix is "; its last line: ..." or "" when the process wrote nothing.
func (l *lastLine) suffix() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.text == "" {
		return ""
	}
	return fmt.Sprintf("; its last line: %q", l.text)
}
