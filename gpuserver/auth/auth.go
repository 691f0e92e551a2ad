// Package auth holds the gpuserver's credentials. One secret key per gpuserver (a file of mode 0600, created at
// first start) derives all of them, so nothing but the key has to be stored and a gpuserver restart keeps every
// credential valid:
//
//   - the administrator token, HMAC(key, "\x00admin"), held by the provider: registration, deregistration and
//     every binding;
//   - a function's token, HMAC(key, name), handed to the function's processes (FAAS_GPU_TOKEN): the remoting
//     hello, and acquire and release of that function's own bindings;
//   - a registration ticket, HMAC(key, "\x00register\x00" + the spec as JSON), which the provider computes for a
//     function that registers itself (in a cluster the provider cannot reach each node's gpuserver): it lets the
//     bearer register exactly that spec and nothing else.
//
// Function names never contain a NUL byte (pool.FunctionSpec.Validate), so the three kinds cannot collide.
// Comparisons are constant-time; an empty credential never matches.
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Errors of authentication; the API answers 401 and 403 for them.
var (
	// ErrUnauthenticated: the request carries no credential, or one the gpuserver did not issue.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrForbidden: the credential is valid but does not allow the request (another function's token).
	ErrForbidden = errors.New("forbidden")
)

// KeyBytes is the size of a generated key.
const KeyBytes = 32

// Key is a gpuserver's secret.
type Key []byte

// NewKey returns a random key.
func NewKey() (Key, error) {
	k := make(Key, KeyBytes)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("auth: random key: %w", err)
	}
	return k, nil
}

// LoadKey reads the key at path (ReadKey), creating a random one (mode 0600, its directory 0700 when created)
// when the file does not exist.
func LoadKey(path string) (Key, error) {
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		return ReadKey(path)
	}
	k, err := NewKey()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("auth: key file %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) { // created meanwhile by another process
		return ReadKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("auth: key file %s: %w", path, err)
	}
	_, werr := f.Write(k)
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		return nil, fmt.Errorf("auth: key file %s: %w", path, err)
	}
	return k, nil
}

// ReadKey reads an existing key file. A key file that other users may read, or one shorter than KeyBytes, is
// refused with an error naming the file: a leaked key is every function's credential.
func ReadKey(path string) (Key, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("auth: key file %s: %w", path, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("auth: key file %s has mode %04o: other users could read every credential; "+
			"chmod 600 it", path, st.Mode().Perm())
	}
	k, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: key file %s: %w", path, err)
	}
	if len(k) < KeyBytes {
		return nil, fmt.Errorf("auth: key file %s holds %d bytes, want at least %d", path, len(k), KeyBytes)
	}
	return Key(k), nil
}

func (k Key) mac(parts ...string) string {
	m := hmac.New(sha256.New, k)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// AdminToken is the administrator's credential.
func (k Key) AdminToken() string { return k.mac("\x00admin") }

// FunctionToken is function's credential (its processes' FAAS_GPU_TOKEN).
func (k Key) FunctionToken(function string) string { return k.mac(function) }

// Ticket is the credential that registers exactly spec (after Validate filled its defaults).
func (k Key) Ticket(spec pool.FunctionSpec) (string, error) {
	if err := spec.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("auth: ticket: %w", err)
	}
	return k.mac("\x00register\x00", string(b)), nil
}

// Equal compares two credentials in constant time; an empty one never matches.
func Equal(got, want string) bool {
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// IsAdmin reports whether token is the administrator's.
func (k Key) IsAdmin(token string) bool { return Equal(token, k.AdminToken()) }

// IsFunction reports whether token is function's.
func (k Key) IsFunction(function, token string) bool {
	return function != "" && Equal(token, k.FunctionToken(function))
}

// IsTicket reports whether ticket registers spec.
func (k Key) IsTicket(spec pool.FunctionSpec, ticket string) bool {
	want, err := k.Ticket(spec)
	return err == nil && Equal(ticket, want)
}
