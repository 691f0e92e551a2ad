package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCheckCallbackHeader: an asynchronous call with a misspelt callback header is refused with 400 naming it and
// the right one; X-Callback-Url and calls without a callback pass.
func TestCheckCallbackHeader(t *testing.T) {
	h := checkCallbackHeader(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	}))
	for _, tc := range []struct {
		header map[string]string
		want   int
	}{
		{nil, http.StatusAccepted},
		{map[string]string{"X-Callback-Url": "http://127.0.0.1:9000/"}, http.StatusAccepted},
		{map[string]string{"x-callback-url": "http://127.0.0.1:9000/"}, http.StatusAccepted},
		{map[string]string{"X-Callback": "http://127.0.0.1:9000/"}, http.StatusBadRequest},
		{map[string]string{"Callback-Url": "http://127.0.0.1:9000/"}, http.StatusBadRequest},
		{map[string]string{"X-Callback-Uri": "http://127.0.0.1:9000/"}, http.StatusBadRequest},
	} {
		req := httptest.NewRequest(http.MethodPost, "/async-function/echo", strings.NewReader("x"))
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("%v: %d %s, want %d", tc.header, rec.Code, rec.Body, tc.want)
		}
		if tc.want == http.StatusBadRequest {
			for name := range tc.header {
				if !strings.Contains(rec.Body.String(), "header "+http.CanonicalHeaderKey(name)) ||
					!strings.Contains(rec.Body.String(), "-H 'X-Callback-Url: http://...'") {
					t.Errorf("%v: %q does not name the header and the right form", tc.header, rec.Body)
				}
			}
		}
	}
}
