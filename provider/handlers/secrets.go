package handlers

import (
	"log/slog"
	"net/http"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// MakeSecretsHandler answers /system/secrets: GET lists names ([{"name","namespace"}], never values); POST creates
// (409 when it exists); PUT updates (404 when unknown); DELETE removes (404 when unknown). Bodies are faas-provider
// types.Secret; mutations answer 202. A nil store answers 501.
func MakeSecretsHandler(s provider.SecretStore, b provider.Backend, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s == nil {
			notImplemented(w, r)
			return
		}
		if r.Method == http.MethodGet {
			ns, err := namespace(r.Context(), b, r.URL.Query().Get("namespace"))
			if err != nil {
				writeError(w, log, r, err)
				return
			}
			list, err := s.ListSecrets(r.Context(), ns)
			if err != nil {
				writeError(w, log, r, err)
				return
			}
			for i := range list {
				list[i].Value, list[i].RawValue = "", nil
			}
			if list == nil {
				list = []types.Secret{}
			}
			writeJSON(w, list)
			return
		}
		var sec types.Secret
		if err := decodeJSON(r, &sec); err != nil {
			writeError(w, log, r, err)
			return
		}
		if err := names.Secret("name", sec.Name); err != nil {
			writeError(w, log, r, err)
			return
		}
		ns, err := namespace(r.Context(), b, firstNonEmpty(sec.Namespace, r.URL.Query().Get("namespace")))
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		sec.Namespace = ns
		switch r.Method {
		case http.MethodPost:
			err = s.CreateSecret(r.Context(), sec)
		case http.MethodPut:
			err = s.UpdateSecret(r.Context(), sec)
		case http.MethodDelete:
			err = s.DeleteSecret(r.Context(), ns, sec.Name)
		}
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}
}
