package handlers

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/openfaas/faas-provider/types"
)

// TestNamespacesAsFaasCliManagesThem: the requests of faas-cli's namespace commands (the OpenFaaS go-sdk) against
// the local backend: create (POST /system/namespace/ with the name in the body and no Content-Type, as the go-sdk
// sends it), get, update, list, a function deployed to the namespace and invoked as name.namespace, and delete,
// which waits until the namespace has no function; bad names and the default namespace are refused.
func TestNamespacesAsFaasCliManagesThem(t *testing.T) {
	f := newFixture(t)
	f.expect(t, http.MethodGet, "/system/namespaces", nil, http.StatusOK, `["openfaas-fn"]`)
	body := `{"name":"team-a","labels":{"openfaas":"1"},"annotations":{"openfaas":"1"}}`
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/system/namespace/", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req) // no Content-Type, as the go-sdk sends it
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("creating team-a: %d", resp.StatusCode)
	}
	f.expect(t, http.MethodPost, "/system/namespace/", body, http.StatusConflict, "team-a")
	var ns types.FunctionNamespace
	if err := json.Unmarshal([]byte(f.expect(t, http.MethodGet, "/system/namespace/team-a", nil, http.StatusOK, "")),
		&ns); err != nil || ns.Name != "team-a" || ns.Labels["openfaas"] != "1" {
		t.Fatalf("team-a: %+v %v", ns, err)
	}
	f.expect(t, http.MethodPut, "/system/namespace/team-a",
		types.FunctionNamespace{Name: "team-a", Labels: map[string]string{"team": "a"}}, http.StatusAccepted, "")
	f.expect(t, http.MethodGet, "/system/namespace/team-a", nil, http.StatusOK, `"team":"a"`)
	f.expect(t, http.MethodGet, "/system/namespaces", nil, http.StatusOK, `["openfaas-fn","team-a"]`)

	fd := deployment("echo")
	fd.Namespace = "team-a"
	f.deploy(t, fd)
	f.expect(t, http.MethodPost, "/function/echo.team-a", "from team a", http.StatusOK, "from team a")
	f.expect(t, http.MethodGet, "/system/functions?namespace=team-a", nil, http.StatusOK, `"namespace":"team-a"`)
	f.expect(t, http.MethodGet, "/system/functions", nil, http.StatusOK, `[]`)
	f.expect(t, http.MethodDelete, "/system/namespace/team-a", nil, http.StatusBadRequest, "delete them first")
	f.expect(t, http.MethodDelete, "/system/functions", types.DeleteFunctionRequest{FunctionName: "echo",
		Namespace: "team-a"}, http.StatusAccepted, "")
	f.expect(t, http.MethodDelete, "/system/namespace/team-a",
		types.FunctionNamespace{Name: "team-a", Labels: map[string]string{"openfaas": "1"}}, http.StatusAccepted, "")
	f.expect(t, http.MethodGet, "/system/namespace/team-a", nil, http.StatusNotFound, "team-a")

	f.expect(t, http.MethodPost, "/system/namespace/", types.FunctionNamespace{Name: "Team_B"}, http.StatusBadRequest,
		"name")
	f.expect(t, http.MethodPut, "/system/namespace/x", types.FunctionNamespace{Name: "y"}, http.StatusBadRequest,
		"the path")
	f.expect(t, http.MethodDelete, "/system/namespace/openfaas-fn", nil, http.StatusBadRequest, "default")
	f.expect(t, http.MethodPost, "/system/namespace/", "name=team-c", http.StatusBadRequest, "JSON")
}
