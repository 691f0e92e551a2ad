package handlers

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/gorilla/mux"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/validate"
)

// MakeNamespaceHandler answers /system/namespace/{name} as faas-netes does for faas-cli's namespace commands (the
// OpenFaaS go-sdk): GET returns the namespace as types.FunctionNamespace (404 when unknown); POST (to
// /system/namespace/, the name in the body) creates it (201; 409 when it exists); PUT replaces its labels and
// annotations (202; 404 when unknown); DELETE removes it (202; 404 when unknown; 400 for the default namespace or
// one that still has functions). A name in the path and another in the body is 400. A nil store answers 501.
func MakeNamespaceHandler(s provider.NamespaceStore, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s == nil {
			notImplemented(w, r)
			return
		}
		name := mux.Vars(r)["name"]
		if r.Method == http.MethodGet {
			ns, err := s.GetNamespace(r.Context(), name)
			if err != nil {
				writeError(w, log, r, err)
				return
			}
			writeJSON(w, ns)
			return
		}
		var ns types.FunctionNamespace
		if r.Method != http.MethodDelete || r.ContentLength != 0 {
			if err := decodeJSON(r, &ns); err != nil {
				writeError(w, log, r, err)
				return
			}
		}
		switch {
		case ns.Name == "":
			ns.Name = name
		case name != "" && ns.Name != name:
			writeError(w, log, r, fmt.Errorf("%w: name: the body names namespace %q, the path %q", provider.ErrInvalid,
				ns.Name, name))
			return
		}
		var err error
		switch r.Method {
		case http.MethodPost:
			if err = validate.Namespace(ns); err == nil {
				err = s.CreateNamespace(r.Context(), ns)
			}
		case http.MethodPut:
			if err = validate.Namespace(ns); err == nil {
				err = s.UpdateNamespace(r.Context(), ns)
			}
		case http.MethodDelete:
			err = s.DeleteNamespace(r.Context(), ns.Name)
		}
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}
}
