package e2e

import (
	"path/filepath"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
)

// gpuserverAdmin is a client of the gpuserver API on sock with the administrator's credential, derived from the
// gpuserver's key file: its read APIs (GET /v1/pool, /v1/usage) take a credential, as `faas-gpu pool` finds it.
func gpuserverAdmin(sock, keyFile string) (*client.Client, error) {
	key, err := auth.ReadKey(keyFile)
	if err != nil {
		return nil, err
	}
	return client.New(sock, client.WithToken(key.AdminToken())), nil
}

// upGPUServer is gpuserverAdmin for the gpuserver of the `up` whose state dir is stateDir.
func upGPUServer(t *testing.T, stateDir string) *client.Client {
	t.Helper()
	c, err := gpuserverAdmin(filepath.Join(stateDir, "gpuserver.sock"), filepath.Join(stateDir, "gpuserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
