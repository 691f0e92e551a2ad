package provider

import (
	"errors"
	"net/http"
)

// Sentinel errors. Backends and stores wrap them with %w; StatusCode maps them to HTTP statuses.
var (
	// ErrNotFound: the function, secret or namespace does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: a function or secret of that name exists already.
	ErrExists = errors.New("already exists")
	// ErrInvalid: the request is malformed or names a bad value; the message names the field.
	ErrInvalid = errors.New("invalid request")
	// ErrNotReady: the function exists but no replica is ready to serve.
	ErrNotReady = errors.New("not ready")
	// ErrSlowClient: the client did not send its request body within the server's body timeouts.
	ErrSlowClient = errors.New("the client sent its request body too slowly")
	// ErrTooLarge: the request body is larger than the endpoint accepts.
	ErrTooLarge = errors.New("request body too large")
)

// StatusCode maps an error to the HTTP status a handler answers with. It is the only place that does so.
func StatusCode(err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrExists):
		return http.StatusConflict
	case errors.Is(err, ErrNotReady):
		return http.StatusServiceUnavailable
	case errors.Is(err, ErrSlowClient):
		return http.StatusRequestTimeout
	case errors.Is(err, ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	default:
		return http.StatusInternalServerError
	}
}
