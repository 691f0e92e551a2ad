package handlers

import (
	"net/http"

	"github.com/openfaas/faas-provider/types"
)

// MakeInfoHandler answers GET /system/info with the provider's name, version and orchestration.
func MakeInfoHandler(info types.ProviderInfo) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, info)
	}
}
