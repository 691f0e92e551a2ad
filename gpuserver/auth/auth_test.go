package auth_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "gpuserver.key")
	k, err := auth.LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 || len(k) != auth.KeyBytes {
		t.Fatalf("created key: %v mode %v, %d bytes", err, st.Mode(), len(k))
	}
	again, err := auth.LoadKey(path)
	if err != nil || string(again) != string(k) {
		t.Fatalf("a second load reads the same key: %v", err)
	}
	if err := os.Chmod(path, 0o604); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.ReadKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a key file every user can read: %v", err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("tiny"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.ReadKey(short); err == nil {
		t.Fatal("a 4-byte key accepted")
	}
	if _, err := auth.ReadKey(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadKey of a missing file: %v (it must not create one)", err)
	}
}

func TestCredentialsAreDistinctAndBound(t *testing.T) {
	k, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := auth.NewKey()
	if !k.IsAdmin(k.AdminToken()) || k.IsAdmin(other.AdminToken()) || k.IsAdmin("") {
		t.Fatal("administrator token")
	}
	if !k.IsFunction("a", k.FunctionToken("a")) || k.IsFunction("b", k.FunctionToken("a")) ||
		k.IsFunction("a", k.AdminToken()) || k.IsFunction("", k.FunctionToken("")) {
		t.Fatal("function tokens")
	}
	spec := pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}
	tk, err := k.Ticket(spec)
	if err != nil {
		t.Fatal(err)
	}
	bigger := spec
	bigger.MemoryBytes *= 2
	if !k.IsTicket(spec, tk) || k.IsTicket(bigger, tk) || k.IsAdmin(tk) || k.IsFunction("f", tk) {
		t.Fatal("a ticket allows exactly its spec")
	}
	withDefaults := spec
	_ = withDefaults.Validate()
	if !k.IsTicket(withDefaults, tk) {
		t.Fatal("a ticket does not depend on defaults being spelled out")
	}
}

// TestKeyFileReadableByOwnGroupOnly: a key file group-readable for the process's own group (a Kubernetes Secret
// mounted 0440 for the pod's fsGroup) is read; group-writable, world-readable, or readable by a group the process is
// not in, it is refused.
func TestKeyFileReadableByOwnGroupOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if _, err := auth.LoadKey(path); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o400, true}, {0o440, true}, {0o640, true}, {0o660, false}, {0o604, false}, {0o644, false}} {
		if err := os.Chmod(path, tc.mode); err != nil {
			t.Fatal(err)
		}
		_, err := auth.ReadKey(path)
		if (err == nil) != tc.ok {
			t.Errorf("mode %04o: %v, want ok=%v", tc.mode, err, tc.ok)
		}
	}
	// A group the process is not in.
	groups, _ := os.Getgroups()
	stranger := 54321
	for slices.Contains(groups, stranger) || stranger == os.Getegid() {
		stranger++
	}
	if err := os.Chown(path, -1, stranger); err != nil {
		t.Skipf("cannot give the file another group (needs root): %v", err)
	}
	if err := os.Chmod(path, 0o440); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.ReadKey(path); err == nil {
		t.Error("a key readable by a group the process is not in was read")
	}
}
