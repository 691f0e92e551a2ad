package handlers

import (
	"net/http"
	"runtime"

	"github.com/openfaas/faas-provider/types"
)

// GatewayInfo is the OpenFaaS gateway's answer to GET /system/info (its gateway/types.GatewayInfo): the gateway's
// version beside its provider's info. faas-cli version decodes this shape.
type GatewayInfo struct {
	Provider *types.ProviderInfo `json:"provider"`
	Version  *types.VersionInfo  `json:"version"`
	Arch     string              `json:"arch"`
}

// MakeInfoHandler answers GET /system/info in the shape its caller reads. A gateway reads the provider's
// (types.ProviderInfo, whose "provider" is the name) and wraps it in its own: the OpenFaaS gateway forwards with
// X-Forwarded-For, which it sets on every request it forwards, so a request carrying it gets the provider's shape.
// A client that asks directly (faas-cli version, against `faas-gpu up` or the standalone provider) gets the
// gateway's shape, this build's version as the gateway's: faas-cli cannot decode the provider's.
func MakeInfoHandler(info types.ProviderInfo) http.HandlerFunc {
	gateway := GatewayInfo{Provider: &info, Version: info.Version, Arch: runtime.GOARCH}
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Forwarded-For") != "" {
			writeJSON(w, info)
			return
		}
		writeJSON(w, gateway)
	}
}
