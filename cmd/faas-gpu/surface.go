package main

import (
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/openfaas/faas-provider/auth"

	"github.com/faas-gpu/faas-gpu/provider/basicauth"
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

// newHTTPServer returns the server of a faas-provider surface: headers of at most 64 KiB within 10s, idle
// keep-alive connections closed after 2 minutes, request bodies bounded in size and time by the handlers
// (handlers.LimitBodyTime); its listener bounds the connections (boundedListen).
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: maxHeaderBytes}
}

// maxHeaderBytes bounds a request's headers on the gateway and provider surfaces (what faas-cli, the OpenFaaS
// gateway and browsers send is a few KiB).
const maxHeaderBytes = 64 << 10

// ensureBasicAuth returns the /system/* credentials in dir, creating them at first start (basicauth.Ensure), and
// says loudly which empty credential files it moved aside.
func ensureBasicAuth(dir string, log *slog.Logger) (*auth.BasicAuthCredentials, error) {
	creds, res, err := basicauth.Ensure(dir, time.Now())
	for _, p := range res.MovedAside {
		log.Error("BASIC-AUTH FILE WAS EMPTY: moved aside; new credentials were generated (log in again)", "file", p)
	}
	return creds, err
}
