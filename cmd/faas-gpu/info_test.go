package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/openfaas/faas-provider/auth"
	"github.com/openfaas/faas-provider/types"
)

// TestGatewayInfo: up answers /system/info in the OpenFaaS gateway's shape (gateway/types.GatewayInfo, which
// faas-cli version decodes: a provider part and the gateway's version), behind the /system credentials.
func TestGatewayInfo(t *testing.T) {
	provider := types.ProviderInfo{Name: "faas-gpu", Orchestration: "local",
		Version: &types.VersionInfo{Release: "0.1.0", SHA: "abc123"}}
	creds := &auth.BasicAuthCredentials{User: "admin", Password: "secret"}
	srv := httptest.NewServer(gatewayInfoHandler(provider, creds))
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/system/info")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without credentials: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/system/info", nil)
	req.SetBasicAuth("admin", "secret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The gateway's shape, as faas-cli 0.18.12 vendors it (github.com/openfaas/faas/gateway/types.GatewayInfo).
	var got struct {
		Provider *struct {
			Name          string             `json:"provider"`
			Version       *types.VersionInfo `json:"version"`
			Orchestration string             `json:"orchestration"`
		} `json:"provider"`
		Version *types.VersionInfo `json:"version"`
		Arch    string             `json:"arch"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || got.Provider == nil || got.Provider.Name != "faas-gpu" ||
		got.Provider.Orchestration != "local" || got.Provider.Version == nil || got.Provider.Version.Release != "0.1.0" ||
		got.Version == nil || got.Version.Release != "0.1.0" || got.Version.SHA != "abc123" || got.Arch != runtime.GOARCH {
		t.Fatalf("/system/info: %d %+v", resp.StatusCode, got)
	}
}
