package local

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestRecordWithUnusableLimitsStillStarts: a function recorded before limits and requests were validated (e.g.
// limits.memory "lots") is restored with them dropped and a warning, not moved aside as corrupt.
func TestRecordWithUnusableLimitsStillStarts(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Join(e.state, "functions")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := `{"deployment":{"service":"probe","image":"probe:latest","limits":{"memory":"lots"}},"replicas":1}`
	if err := os.WriteFile(filepath.Join(dir, "probe.json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testkit.Buffer
	e.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := e.open(t)
	st, err := b.Status(context.Background(), "", "probe")
	if err != nil || st.Limits != nil {
		t.Fatalf("restored: %+v %v, want the function without its unusable limits", st, err)
	}
	if !strings.Contains(logs.String(), "limits or requests no engine can use: dropped") {
		t.Fatalf("no warning:\n%s", logs.String())
	}
	waitReady(t, b, "probe", 1)
}
