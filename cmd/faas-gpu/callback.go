package main

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// checkCallbackHeader refuses, with 400 naming the header, an asynchronous call whose callback header is misspelt
// (X-Callback, Callback-Url, X-Callback-Uri, X-Callbackurl, ...): the call would be queued and run, and its result
// dropped without a word. faas-cli sends a header given as -H 'X-Callback-Url: URL'; its older key=value form
// (-H X-Callback-Url=URL) splits at the URL's colon into a name faas-cli itself refuses ("invalid header field
// name"), so that one never arrives.
func checkCallbackHeader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name := range r.Header {
			if name != queue.HeaderCallbackURL && strings.Contains(strings.ToLower(name), "callback") {
				w.Header().Set("X-OpenFaaS-Internal", "frontdoor")
				http.Error(w, fmt.Sprintf("header %s: the callback URL goes in %s (faas-cli: -H '%s: http://...'; "+
					"curl: -H '%s: http://...')", name, queue.HeaderCallbackURL, queue.HeaderCallbackURL,
					queue.HeaderCallbackURL), http.StatusBadRequest)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
