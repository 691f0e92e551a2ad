package charts

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// The chart's NATS requires the password of a Secret and carries 8 MiB messages (the real
// nats-server parses the rendered configuration); the queue worker reads the same Secret.
func TestNATSAuthFromSecret(t *testing.T) {
	objs := decodeAll(t, render(t))
	cm := find[*corev1.ConfigMap](t, objs, "ConfigMap", "faas-gpu-nats-config")
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(cm.Data["nats.conf"]), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_PASSWORD", "from-the-secret")
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refuses the chart's configuration: %v\n%s", err, cm.Data["nats.conf"])
	}
	if opts.Username != "faas-gpu" || opts.Password != "from-the-secret" || opts.MaxPayload != queue.MaxMessageBytes {
		t.Fatalf("NATS configuration: user %q password %q max_payload %d; want faas-gpu, the Secret's, %d",
			opts.Username, opts.Password, opts.MaxPayload, queue.MaxMessageBytes)
	}

	sts := find[*appsv1.StatefulSet](t, objs, "StatefulSet", "faas-gpu-nats")
	c := sts.Spec.Template.Spec.Containers[0]
	if !strings.Contains(strings.Join(c.Args, " "), "--config /etc/nats/nats.conf") {
		t.Errorf("NATS args %v do not load the configuration", c.Args)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "NATS_PASSWORD" || c.Env[0].ValueFrom.SecretKeyRef.Name != "faas-gpu-nats-auth" ||
		c.Env[0].ValueFrom.SecretKeyRef.Key != "nats-password" {
		t.Errorf("NATS env %+v, want NATS_PASSWORD from Secret faas-gpu-nats-auth", c.Env)
	}
	sec := find[*corev1.Secret](t, objs, "Secret", "faas-gpu-nats-auth")
	if sec.Annotations["helm.sh/hook"] != "pre-install" || sec.Annotations["helm.sh/resource-policy"] != "keep" ||
		len(sec.StringData["nats-password"]) != 40 {
		t.Errorf("generated Secret %+v: want a pre-install hook kept on uninstall with a 40-character password", sec.ObjectMeta)
	}
	checkWorkerSecret(t, objs, "faas-gpu-nats-auth")

	// An operator's own Secret: nothing generated, both sides use it.
	objs = decodeAll(t, render(t, "nats.auth.secretName=my-nats"))
	for _, o := range objs {
		if o.Kind == "Secret" && strings.Contains(o.Name, "nats") {
			t.Errorf("Secret %s rendered although nats.auth.secretName is set", o.Name)
		}
	}
	sts = find[*appsv1.StatefulSet](t, objs, "StatefulSet", "faas-gpu-nats")
	if ref := sts.Spec.Template.Spec.Containers[0].Env[0].ValueFrom.SecretKeyRef; ref.Name != "my-nats" {
		t.Errorf("NATS password from %q, want my-nats", ref.Name)
	}
	checkWorkerSecret(t, objs, "my-nats")

	// An external NATS: credentials only when a Secret is named.
	objs = decodeAll(t, render(t, "nats.enabled=false", "nats.external.url=nats://nats.messaging:4222"))
	qw := find[*appsv1.Deployment](t, objs, "Deployment", "faas-gpu-queue-worker")
	for _, e := range qw.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "FAAS_GPU_NATS_PASSWORD_FILE" {
			t.Error("the queue worker reads a NATS password although none was configured for the external NATS")
		}
	}
	objs = decodeAll(t, render(t, "nats.enabled=false", "nats.external.url=nats://nats.messaging:4222", "nats.auth.secretName=ext"))
	checkWorkerSecret(t, objs, "ext")
}

// checkWorkerSecret checks that the queue worker reads its NATS password from the named Secret, as a file only its
// group can read.
func checkWorkerSecret(t *testing.T, objs []object, secret string) {
	t.Helper()
	qw := find[*appsv1.Deployment](t, objs, "Deployment", "faas-gpu-queue-worker")
	spec := qw.Spec.Template.Spec
	file := ""
	for _, e := range spec.Containers[0].Env {
		if e.Name == "FAAS_GPU_NATS_PASSWORD_FILE" {
			file = e.Value
		}
	}
	if len(spec.Volumes) != 1 || spec.Volumes[0].Secret == nil || spec.Volumes[0].Secret.SecretName != secret ||
		*spec.Volumes[0].Secret.DefaultMode != 0o440 || len(spec.Containers[0].VolumeMounts) != 1 ||
		filepath.Join(spec.Containers[0].VolumeMounts[0].MountPath, "nats-password") != file ||
		spec.SecurityContext == nil || spec.SecurityContext.FSGroup == nil {
		t.Errorf("queue worker: password file %q, volumes %+v, mounts %+v, security %+v; want Secret %s mounted 0440 for its group",
			file, spec.Volumes, spec.Containers[0].VolumeMounts, spec.SecurityContext, secret)
	}
}
