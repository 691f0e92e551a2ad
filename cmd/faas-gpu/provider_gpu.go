package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	gpuauth "github.com/faas-gpu/faas-gpu/gpuserver/auth"
)

// localGPUEnv is what the standalone provider's local backend gives the replicas of GPU functions, as `faas-gpu up`
// does: the gpuserver's remoting socket, the shim's folder first on LD_LIBRARY_PATH (so the function's CUDA calls
// reach the shim) and the function's remoting token.
func localGPUEnv(cfg providerConfig, log *slog.Logger) (func(function string) map[string]string, error) {
	key, err := os.ReadFile(cfg.gpuserverKey)
	if err != nil {
		return nil, usageError{fmt.Errorf("-gpuserver-key-file: %w", err)}
	}
	if len(key) < 32 {
		return nil, usageError{fmt.Errorf("-gpuserver-key-file %s: %d bytes, not a gpuserver key", cfg.gpuserverKey, len(key))}
	}
	remoting := cfg.remotingSocket
	if remoting == "" {
		remoting = filepath.Join(filepath.Dir(cfg.gpuserverSocket), "remoting.sock")
	}
	shimDir := findShimDir(cfg.shimDir)
	if _, err := os.Stat(filepath.Join(shimDir, "libcuda.so.1")); err != nil {
		log.Warn("the shim is not built: GPU functions that call CUDA will fail (run make shim or pass -shim-dir)",
			"shim_dir", shimDir)
	}
	return func(function string) map[string]string {
		return map[string]string{
			"FAAS_GPU_REMOTING_SOCKET": remoting,
			"FAAS_GPU_TOKEN":           functionToken(key, function),
			"LD_LIBRARY_PATH":          joinPathList(shimDir, os.Getenv("LD_LIBRARY_PATH")),
		}
	}, nil
}

// functionToken is a function's remoting token as the gpuserver derives it from its key file (HMAC-SHA256 of the
// function's name, hex); TestFunctionTokenMatchesTheGPUServer pins the two together.
func functionToken(key []byte, function string) string {
	return gpuauth.Key(key).FunctionToken(function)
}
