// Package basicauth keeps the provider's basic-auth credentials as files, the way OpenFaaS does: a folder holding
// basic-auth-user and basic-auth-password (the `basic-auth` secret mounted at faas-netes' secret_mount_path in a
// cluster, <state-dir>/secrets for `faas-gpu up`). Read reads them with faas-provider's auth package and refuses
// empty values; Ensure creates them at first start (user admin, a random password, mode 0600).
package basicauth

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/openfaas/faas-provider/auth"
)

// File names in the credentials folder (faas-provider's defaults).
const (
	UserFile     = "basic-auth-user"
	PasswordFile = "basic-auth-password"
	// DefaultUser is the user Ensure creates, as the OpenFaaS charts do.
	DefaultUser = "admin"
)

// ErrInvalid: the credential files exist but hold no usable value.
var ErrInvalid = errors.New("invalid basic-auth credentials")

// Read reads the credentials in dir. An empty user or password is refused (faas-provider would accept any
// password then); errors name the file.
func Read(dir string) (*auth.BasicAuthCredentials, error) {
	r := auth.ReadBasicAuthFromDisk{SecretMountPath: dir, UserFilename: UserFile, PasswordFilename: PasswordFile}
	c, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("basic auth: %w (the folder must hold %s and %s)", err, UserFile, PasswordFile)
	}
	switch {
	case c.User == "":
		return nil, fmt.Errorf("%w: %s is empty", ErrInvalid, filepath.Join(dir, UserFile))
	case c.Password == "":
		return nil, fmt.Errorf("%w: %s is empty", ErrInvalid, filepath.Join(dir, PasswordFile))
	}
	return c, nil
}

// Result says what Ensure did, for the caller to log.
type Result struct {
	// Created is set when Ensure wrote new credentials (first start, or files moved aside).
	Created bool
	// MovedAside lists files that held no usable value and were renamed to <file>.corrupt-<time>.
	MovedAside []string
}

// Ensure returns the credentials in dir, creating dir (mode 0700) and the files (user admin, a random 32-byte
// password, mode 0600) when they are missing. Files that exist but hold nothing usable (empty, truncated to white
// space) are moved aside and replaced; the caller should say so loudly. A password file readable by others is
// made 0600.
func Ensure(dir string, now time.Time) (*auth.BasicAuthCredentials, Result, error) {
	var res Result
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, res, fmt.Errorf("basic auth: %w", err)
	}
	userPath, pwPath := filepath.Join(dir, UserFile), filepath.Join(dir, PasswordFile)
	for _, p := range []string{userPath, pwPath} {
		raw, err := os.ReadFile(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, res, fmt.Errorf("basic auth: %w", err)
		case strings.TrimSpace(string(raw)) == "":
			aside := p + ".corrupt-" + now.UTC().Format("20060102T150405Z")
			if err := os.Rename(p, aside); err != nil {
				return nil, res, fmt.Errorf("basic auth: moving aside the empty %s: %w", p, err)
			}
			res.MovedAside = append(res.MovedAside, p)
		}
	}
	_, uerr := os.Stat(userPath)
	_, perr := os.Stat(pwPath)
	if errors.Is(uerr, os.ErrNotExist) || errors.Is(perr, os.ErrNotExist) {
		// Both are written together: a user file without its password (or the reverse) is replaced too.
		pw, err := newPassword()
		if err != nil {
			return nil, res, err
		}
		if err := writeFile(userPath, DefaultUser+"\n"); err != nil {
			return nil, res, err
		}
		if err := writeFile(pwPath, pw+"\n"); err != nil {
			return nil, res, err
		}
		res.Created = true
	}
	if st, err := os.Stat(pwPath); err == nil && st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(pwPath, 0o600); err != nil {
			return nil, res, fmt.Errorf("basic auth: %w", err)
		}
	}
	c, err := Read(dir)
	return c, res, err
}

func newPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("basic auth: generating a password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// writeFile writes a credential file with mode 0600 through a temporary file and a rename.
func writeFile(path, value string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("basic auth: %w", err)
	}
	tmp := f.Name()
	_, werr := f.WriteString(value)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("basic auth: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("basic auth: writing %s: %w", path, err)
	}
	return nil
}

// LoginCommand is the faas-cli line that logs in to gateway with the password in dir.
func LoginCommand(dir, user, gateway string) string {
	return fmt.Sprintf("cat %s | faas-cli login --gateway %s --username %s --password-stdin",
		shellQuote(filepath.Join(dir, PasswordFile)), gateway, user)
}

func shellQuote(s string) string {
	if strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
