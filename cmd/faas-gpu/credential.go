package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
)

// readerFlags are the flags of `pool` and `usage` that reach a gpuserver's read APIs (GET /v1/pool, /v1/usage),
// which take a credential: the administrator's sees every function, a function's its own namespace only.
type readerFlags struct {
	socket  string
	url     string
	keyFile string
}

func (r *readerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.socket, "socket", "", "Unix socket of the gpuserver API (default: <state-dir>/gpuserver.sock)")
	fs.StringVar(&r.url, "url", "", "TCP URL of the gpuserver API (instead of -socket), e.g. http://127.0.0.1:8090")
	fs.StringVar(&r.keyFile, "key-file", "", "the gpuserver's key file (its -key-file), from which the "+
		"administrator's credential is derived (default: <state-dir>/gpuserver.key, where `up` keeps it, when it "+
		"exists; else the token in $"+contract.EnvToken+", a function's, which sees its own namespace only)")
}

// client returns a client of the gpuserver for stateDir with the credential the flags name.
func (r *readerFlags) client(stateDir string) (*client.Client, error) {
	if r.socket == "" {
		r.socket = filepath.Join(stateDir, "gpuserver.sock")
	}
	token, err := r.token(stateDir)
	if err != nil {
		return nil, err
	}
	if r.url != "" {
		return client.NewTCP(r.url, client.WithToken(token)), nil
	}
	return client.New(r.socket, client.WithToken(token)), nil
}

func (r *readerFlags) token(stateDir string) (string, error) {
	path, explicit := r.keyFile, r.keyFile != ""
	if !explicit {
		path = filepath.Join(stateDir, "gpuserver.key")
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return os.Getenv(contract.EnvToken), nil
		}
	}
	key, err := auth.ReadKey(path)
	if err != nil {
		return "", usageError{fmt.Errorf("-key-file: %w (the gpuserver's read APIs take the administrator's "+
			"credential: run as the user who started it)", err)}
	}
	return key.AdminToken(), nil
}
