package main

import (
	"net/http"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/handlers"
)

// hostAllowList turns an -allowed-hosts value into the Host names the server answers to: the value's
// comma-separated names; "*" for any; empty for the default, which is handlers.LoopbackHosts of the listen host
// (a server on a loopback address answers to loopback names only, so a DNS-rebinding page cannot reach it; one on
// every interface is reached under names it cannot know).
func hostAllowList(flagValue, listenHost string) []string {
	switch strings.TrimSpace(flagValue) {
	case "":
		return handlers.LoopbackHosts(listenHost)
	case "*":
		return nil
	}
	var out []string
	for _, h := range strings.Split(flagValue, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// newHTTPServer returns the server of a faas-provider surface: headers within 10s, idle keep-alive connections
// closed after 2 minutes, request bodies bounded by the handlers (handlers.LimitBodyTime).
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 1 << 20}
}
