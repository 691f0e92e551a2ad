package handlers

import (
	"log/slog"
	"net/http"

	"github.com/faas-gpu/faas-gpu/provider"
)

// MakeNamespacesHandler answers GET /system/namespaces with the backend's namespaces as a JSON array of names.
func MakeNamespacesHandler(b provider.Backend, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ns, err := b.Namespaces(r.Context())
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		if ns == nil {
			ns = []string{}
		}
		writeJSON(w, ns)
	}
}
