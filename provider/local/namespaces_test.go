package local

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// invokeIn resolves a function of a namespace and sends it one request.
func invokeIn(t *testing.T, b *Backend, ns, name, path string) (int, string) {
	t.Helper()
	u, err := b.Resolve(context.Background(), ns, name)
	if err != nil {
		t.Fatalf("Resolve(%s.%s): %v", name, ns, err)
	}
	resp, err := http.Post(u.String()+path, "text/plain", strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// TestNamespacesKeepFunctionsApart: two teams on one machine. A namespace is created as faas-netes creates one
// (labelled and annotated openfaas=1); a function of the same name runs in it and in the default namespace, each
// listed, resolved, given its own namespace's secret of the same name and logged apart; a namespace with a function
// cannot be deleted, nor can the default one; after a restart of the backend both functions and the namespace come
// back; a deployment to a namespace that does not exist is refused naming it.
func TestNamespacesKeepFunctionsApart(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx := context.Background()
	if err := b.CreateNamespace(ctx, types.FunctionNamespace{Name: "team-a", Labels: map[string]string{"team": "a"}}); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateNamespace(ctx, types.FunctionNamespace{Name: "team-a"}); !isErr(err, provider.ErrExists) {
		t.Errorf("creating team-a twice: %v, want ErrExists", err)
	}
	if err := b.CreateNamespace(ctx, types.FunctionNamespace{Name: "Team_A"}); !isErr(err, provider.ErrInvalid) {
		t.Errorf("creating Team_A: %v, want ErrInvalid", err)
	}
	ns, err := b.GetNamespace(ctx, "team-a")
	if err != nil || ns.Labels["openfaas"] != "1" || ns.Annotations["openfaas"] != "1" || ns.Labels["team"] != "a" {
		t.Fatalf("team-a: %+v %v", ns, err)
	}
	if list, _ := b.Namespaces(ctx); len(list) != 2 || list[0] != provider.DefaultNamespace || list[1] != "team-a" {
		t.Fatalf("namespaces %v", list)
	}
	for _, n := range []string{"", "team-a"} {
		if err := b.CreateSecret(ctx, types.Secret{Name: "token", Namespace: n, Value: "of " + n}); err != nil {
			t.Fatal(err)
		}
		fd := probe("probe")
		fd.Namespace, fd.Secrets = n, []string{"token"}
		if err := b.Deploy(ctx, fd); err != nil {
			t.Fatalf("deploy probe to %q: %v", n, err)
		}
	}
	fd := probe("probe")
	fd.Namespace = "team-b"
	if err := b.Deploy(ctx, fd); !isErr(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "team-b") {
		t.Errorf("deploy to a namespace that does not exist: %v", err)
	}
	check := func(b *Backend) {
		t.Helper()
		for _, n := range []string{provider.DefaultNamespace, "team-a"} {
			testkit.Eventually(t, 60*time.Second, "probe."+n+" ready", func() bool {
				st, err := b.Status(ctx, n, "probe")
				return err == nil && st.AvailableReplicas == 1 && st.Namespace == n
			})
			list, err := b.List(ctx, n)
			if err != nil || len(list) != 1 || list[0].Namespace != n {
				t.Errorf("List(%s) = %+v, %v", n, list, err)
			}
			want := "of "
			if n == "team-a" {
				want += "team-a"
			}
			if code, out := invokeIn(t, b, n, "probe", "/?secret=token"); code != 200 || out != want {
				t.Errorf("probe.%s reads its secret as %d %q, want %q", n, code, out, want)
			}
		}
	}
	check(b)
	if err := b.DeleteNamespace(ctx, "team-a"); !isErr(err, provider.ErrInvalid) {
		t.Errorf("deleting team-a with a function: %v, want ErrInvalid", err)
	}
	if err := b.DeleteNamespace(ctx, provider.DefaultNamespace); !isErr(err, provider.ErrInvalid) {
		t.Errorf("deleting the default namespace: %v, want ErrInvalid", err)
	}
	if secrets, err := b.ListSecrets(ctx, "team-a"); err != nil || len(secrets) != 1 || secrets[0].Namespace != "team-a" {
		t.Errorf("secrets of team-a: %+v %v", secrets, err)
	}

	// A restart brings both back.
	cctx, cancel := context.WithTimeout(ctx, 30e9)
	defer cancel()
	if err := b.Close(cctx); err != nil {
		t.Fatal(err)
	}
	b2 := e.open(t)
	check(b2)
	if err := b2.Delete(ctx, "team-a", "probe"); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Status(ctx, provider.DefaultNamespace, "probe"); err != nil {
		t.Errorf("the default namespace's probe after team-a's was deleted: %v", err)
	}
	if err := b2.DeleteNamespace(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.GetNamespace(ctx, "team-a"); !isErr(err, provider.ErrNotFound) {
		t.Errorf("team-a after its deletion: %v", err)
	}
	if _, err := b2.ListSecrets(ctx, "team-a"); !isErr(err, provider.ErrInvalid) {
		t.Errorf("secrets of a deleted namespace: %v, want ErrInvalid", err)
	}
}
