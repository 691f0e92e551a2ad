package main

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/faas-gpu/faas-gpu/contract"
	gpuauth "github.com/faas-gpu/faas-gpu/gpuserver/auth"
)

// localGPUEnv is what the standalone provider's local backend gives the replicas of GPU functions, as `faas-gpu up`
// does: the gpuserver's remoting socket, the shim's folder first on LD_LIBRARY_PATH (so the function's CUDA calls
// reach the shim) and the function's remoting token, derived from key (the gpuserver's key file, read by the caller).
func localGPUEnv(cfg providerConfig, key gpuauth.Key, log *slog.Logger) func(function string) map[string]string {
	remoting := cfg.remotingSocketPath()
	shimDir := findShimDir(cfg.shimDir)
	if _, err := os.Stat(filepath.Join(shimDir, "libcuda.so.1")); err != nil {
		log.Warn("the shim is not built: GPU functions that call CUDA will fail (run make shim or pass -shim-dir)",
			"shim_dir", shimDir)
	}
	return func(function string) map[string]string {
		return map[string]string{
			contract.EnvRemotingSocket: remoting,
			contract.EnvToken:          functionToken(key, function),
			"LD_LIBRARY_PATH":          joinPathList(shimDir, os.Getenv("LD_LIBRARY_PATH")),
		}
	}
}

// functionToken is a function's remoting token as the gpuserver derives it from its key file (HMAC-SHA256 of the
// function's name, hex); TestFunctionTokenMatchesTheGPUServer pins the two together.
func functionToken(key []byte, function string) string {
	return gpuauth.Key(key).FunctionToken(function)
}
