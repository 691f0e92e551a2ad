package basicauth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEnsureCreatesOnceThenKeeps(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c1, res, err := Ensure(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || c1.User != "admin" || len(c1.Password) < 40 {
		t.Fatalf("first Ensure: %+v %+v", c1, res)
	}
	for _, f := range []string{UserFile, PasswordFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v mode %v, want 0600", f, err, st.Mode())
		}
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("folder mode %v, want 0700", st.Mode())
	}
	c2, res, err := Ensure(dir, now)
	if err != nil || res.Created || *c2 != *c1 {
		t.Fatalf("second Ensure changed the credentials: %+v %+v %v", c2, res, err)
	}
	// A password file someone made readable is tightened again.
	if err := os.Chmod(filepath.Join(dir, PasswordFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Ensure(dir, now); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dir, PasswordFile)); st.Mode().Perm() != 0o600 {
		t.Errorf("password file mode %v after Ensure, want 0600", st.Mode())
	}
	if cmd := LoginCommand(dir, "admin", "http://127.0.0.1:8080"); !strings.Contains(cmd, "faas-cli login") ||
		!strings.Contains(cmd, filepath.Join(dir, PasswordFile)) || !strings.Contains(cmd, "--password-stdin") {
		t.Errorf("login command %q", cmd)
	}
}

func TestEnsureReplacesAnEmptyPassword(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, _, err := Ensure(dir, now); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, PasswordFile), []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, res, err := Ensure(dir, now)
	if err != nil || !res.Created || len(res.MovedAside) != 1 || c.Password == "" {
		t.Fatalf("Ensure over an empty password file: %+v %+v %v", c, res, err)
	}
	if _, err := os.Stat(filepath.Join(dir, PasswordFile+".corrupt-20260102T030405Z")); err != nil {
		t.Errorf("the empty file was not moved aside: %v", err)
	}
}

func TestReadRefusesEmptyValues(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), UserFile) {
		t.Errorf("Read of an empty folder: %v, want an error naming %s", err, UserFile)
	}
	_ = os.WriteFile(filepath.Join(dir, UserFile), []byte("admin"), 0o600)
	_ = os.WriteFile(filepath.Join(dir, PasswordFile), []byte("  \n"), 0o600)
	if _, err := Read(dir); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), PasswordFile) {
		t.Errorf("Read with an empty password: %v, want ErrInvalid naming %s", err, PasswordFile)
	}
	_ = os.WriteFile(filepath.Join(dir, PasswordFile), []byte("s3cret\n"), 0o600)
	if c, err := Read(dir); err != nil || c.User != "admin" || c.Password != "s3cret" {
		t.Errorf("Read = %+v, %v", c, err)
	}
}
