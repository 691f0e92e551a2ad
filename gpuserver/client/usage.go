package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
)

// Usage returns the functions' bill since a time (rounded down to the hour by the gpuserver; the zero time: since
// the bill began).
func (c *Client) Usage(ctx context.Context, since time.Time) (metering.Report, error) {
	path := "/v1/usage"
	if !since.IsZero() {
		path += "?since=" + url.QueryEscape(since.UTC().Format(time.RFC3339))
	}
	var r metering.Report
	err := c.do(ctx, http.MethodGet, path, nil, &r)
	return r, err
}
