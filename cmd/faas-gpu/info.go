package main

import (
	"encoding/json"
	"net/http"
	"runtime"

	"github.com/openfaas/faas-provider/auth"
	"github.com/openfaas/faas-provider/types"
)

// gatewayInfo is the OpenFaaS gateway's answer to GET /system/info (gateway/types.GatewayInfo): the gateway's own
// version beside its provider's info. faas-cli version reads this shape from a gateway (it prints both parts, and
// --json fails on a provider's bare shape); `up` is the gateway, so it answers in it.
type gatewayInfo struct {
	Provider *types.ProviderInfo `json:"provider"`
	Version  *types.VersionInfo  `json:"version"`
	Arch     string              `json:"arch"`
}

// gatewayInfoHandler answers GET /system/info as the OpenFaaS gateway does, behind the /system credentials (none:
// open, as the provider's other routes with -basic-auth=false).
func gatewayInfoHandler(provider types.ProviderInfo, creds *auth.BasicAuthCredentials) http.Handler {
	info := gatewayInfo{Provider: &provider, Version: provider.Version, Arch: runtime.GOARCH}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(info)
	})
	if creds == nil {
		return h
	}
	return auth.DecorateWithBasicAuth(h, creds)
}
