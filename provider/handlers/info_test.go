package handlers

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/openfaas/faas-provider/types"
)

// TestInfoShapes: /system/info answers a gateway's forwarded request (X-Forwarded-For, as the OpenFaaS CE gateway
// sends it) in the provider's shape, which decodes strictly into faas-provider's types.ProviderInfo (the gateway's
// own decode failed on the gateway's shape: "cannot unmarshal object into Go struct field ProviderInfo.provider of
// type string"), and faas-cli's direct request in the gateway's, whose parts are faas-provider's types (faas-cli
// version could not decode the provider's).
func TestInfoShapes(t *testing.T) {
	info := types.ProviderInfo{Name: "faas-gpu", Orchestration: "local", Version: &types.VersionInfo{Release: "0.1.0", SHA: "abc"}}
	srv := httptest.NewServer(MakeInfoHandler(info))
	defer srv.Close()
	get := func(header map[string]string) []byte {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/system/info", nil)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		return raw
	}
	strict := func(raw []byte, v any) error {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		return d.Decode(v)
	}

	// The CE gateway's forwarding proxy: the client's headers, plus X-Forwarded-For and X-Forwarded-Host.
	raw := get(map[string]string{"X-Forwarded-For": "127.0.0.1:50312", "X-Forwarded-Host": "127.0.0.1:8080"})
	var p types.ProviderInfo
	if err := strict(raw, &p); err != nil || p.Name != "faas-gpu" || p.Orchestration != "local" || p.Version == nil ||
		p.Version.Release != "0.1.0" {
		t.Fatalf("to a gateway: %s (%v), want the provider's shape", raw, err)
	}

	// faas-cli version: a plain GET.
	raw = get(nil)
	var g struct {
		Provider *types.ProviderInfo `json:"provider"`
		Version  *types.VersionInfo  `json:"version"`
		Arch     string              `json:"arch"`
	}
	if err := strict(raw, &g); err != nil || g.Provider == nil || g.Provider.Name != "faas-gpu" ||
		g.Provider.Orchestration != "local" || g.Version == nil || g.Version.Release != "0.1.0" || g.Arch != runtime.GOARCH {
		t.Fatalf("to faas-cli: %s (%v), want the gateway's shape", raw, err)
	}
	if err := json.Unmarshal(raw, &p); err == nil {
		t.Fatalf("the gateway's shape decodes as a provider's: %s", raw)
	}
}
