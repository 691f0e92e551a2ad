package handlers

import "net/http"

// MakeHealthHandler answers GET and HEAD /healthz with 200 while the provider serves.
func MakeHealthHandler() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = w.Write([]byte("OK"))
		}
	}
}
