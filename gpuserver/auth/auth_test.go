package auth_test

import (
	"errors"
	"os"
	"path/filepath"
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
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.ReadKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a key file its group can read: %v", err)
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
