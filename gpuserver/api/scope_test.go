package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// getRaw is GET path on the API's socket with token (none when empty): the status and the body as sent.
func getRaw(t *testing.T, sock, path, token string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "http://gpuserver"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// TestReadAPIsAreScopedToTheCallersTenant: GET /v1/pool and /v1/usage answer 401 without a credential and 403 with
// one the gpuserver did not issue; a function's token sees its own namespace's functions only (their status,
// residents and bill), none of another tenant's names or bill anywhere in the answer; the administrator sees every
// function. Before, both were open: any process that could reach the socket (every function's) read every
// tenant's function names and bill.
func TestReadAPIsAreScopedToTheCallersTenant(t *testing.T) {
	ctx := context.Background()
	p, err := pool.NewFCFS([]pool.GPU{{Name: "gpu0", MemoryBytes: 4 << 30}, {Name: "gpu1", MemoryBytes: 4 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	meter, err := metering.Open(metering.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = meter.Close() })
	reg := prometheus.NewRegistry()
	srv, err := api.New(p, reg, reg, nil, api.WithAuth(key), api.WithUsage(meter))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "gpuserver.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.NewHTTPServer()
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })

	admin := client.New(sock, client.WithToken(key.AdminToken()))
	tenants := map[string][]string{"team-a": {"alpha.team-a", "beta.team-a"}, "team-b": {"victim.team-b"},
		"": {"plain"}}
	var all []string
	for _, names := range tenants {
		for _, name := range names {
			all = append(all, name)
			if err := admin.Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 1 << 30}); err != nil {
				t.Fatal(err)
			}
			// Each function is served once (it is resident on a GPU and counted) and billed.
			fc := client.New(sock, client.WithToken(key.FunctionToken(name)))
			b, err := fc.Acquire(ctx, name, 0)
			if err != nil {
				t.Fatal(err)
			}
			meter.Begin(b.ID, name, 1<<30)
			meter.End(b.ID)
			if err := fc.Release(ctx, b.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	slices.Sort(all)

	for _, path := range []string{"/v1/pool", "/v1/usage"} {
		if code, body := getRaw(t, sock, path, ""); code != http.StatusUnauthorized || strings.Contains(body, "team") {
			t.Errorf("%s without a credential: %d %s, want 401", path, code, body)
		}
		if code, _ := getRaw(t, sock, path, strings.Repeat("0", 64)); code != http.StatusForbidden {
			t.Errorf("%s with a credential the gpuserver did not issue: %d, want 403", path, code)
		}
	}

	type view struct {
		status pool.Status
		bill   metering.Report
		raw    string
	}
	read := func(token string) view {
		t.Helper()
		var v view
		for _, x := range []struct {
			path string
			into any
		}{{"/v1/pool", &v.status}, {"/v1/usage", &v.bill}} {
			code, body := getRaw(t, sock, x.path, token)
			if code != http.StatusOK {
				t.Fatalf("%s: %d %s", x.path, code, body)
			}
			if err := json.Unmarshal([]byte(body), x.into); err != nil {
				t.Fatalf("%s: %v: %s", x.path, err, body)
			}
			v.raw += body
		}
		return v
	}
	names := func(v view) (status, residents, bill []string) {
		for _, f := range v.status.Functions {
			status = append(status, f.Name)
		}
		for _, g := range v.status.GPUs {
			residents = append(residents, g.Resident...)
		}
		for _, u := range v.bill.Functions {
			bill = append(bill, u.Name)
		}
		slices.Sort(status)
		slices.Sort(residents)
		slices.Sort(bill)
		return status, residents, bill
	}

	for ns, own := range tenants {
		want := slices.Clone(own)
		slices.Sort(want)
		for _, name := range own {
			v := read(key.FunctionToken(name))
			status, residents, bill := names(v)
			if !slices.Equal(status, want) || !slices.Equal(residents, want) || !slices.Equal(bill, want) {
				t.Errorf("%s's token: functions %v, residents %v, bill %v; want %v in each", name, status, residents,
					bill, want)
			}
			for _, other := range all {
				if !slices.Contains(want, other) && strings.Contains(v.raw, other) {
					t.Errorf("%s's token (namespace %q) reads %s, another tenant's function:\n%s", name, ns, other,
						v.raw)
				}
			}
			if len(v.status.GPUs) != 2 || !v.status.GPUs[0].Healthy {
				t.Errorf("%s's token: GPUs %+v, want the node's two, healthy", name, v.status.GPUs)
			}
		}
	}
	status, residents, bill := names(read(key.AdminToken()))
	if !slices.Equal(status, all) || !slices.Equal(residents, all) || !slices.Equal(bill, all) {
		t.Errorf("the administrator: functions %v, residents %v, bill %v; want %v in each", status, residents, bill,
			all)
	}
	// The package client reads the same, scoped, with a function's token.
	st, err := client.New(sock, client.WithToken(key.FunctionToken("victim.team-b"))).Status(ctx)
	if err != nil || len(st.Functions) != 1 || st.Functions[0].Name != "victim.team-b" {
		t.Errorf("client.Status with victim.team-b's token: %+v %v", st.Functions, err)
	}
}
