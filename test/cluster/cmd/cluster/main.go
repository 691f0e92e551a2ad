// Command cluster runs a command against a live single-node Kubernetes on this machine (see package harness):
//
//	cluster run [flags] -- CMD [ARGS...]   build the images, start the cluster, run CMD, stop it, restore the host
//	cluster down [flags]                   stop a cluster left by a killed run and restore the host
//
// CMD runs with KUBECONFIG set to the admin kubeconfig and FAAS_GPU_TEST_CLUSTER to a JSON file describing the
// cluster (harness.Info), which the live tests in test/cluster read. The exit status is CMD's, or 1 when the cluster
// could not start or the host could not be restored. SIGINT and SIGTERM stop CMD and still restore the host.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/faas-gpu/faas-gpu/test/cluster/harness"
	"github.com/faas-gpu/faas-gpu/test/cluster/imagebuild"
	"github.com/faas-gpu/faas-gpu/test/cluster/images"
)

type config struct {
	cache, runDir            string
	k8sBin, knativeBin, etcd string
	coredns, cniBin, rootfs  string
	faasGPU, shim            string
	functions                []string
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func usage() int {
	fmt.Fprintln(os.Stderr, "usage: cluster run [flags] -- CMD [ARGS...] | cluster down [flags]")
	return 2
}

func run(args []string) int {
	if len(args) == 0 {
		return usage()
	}
	home, _ := os.UserHomeDir()
	c := config{}
	fs := flag.NewFlagSet("cluster "+args[0], flag.ContinueOnError)
	fs.StringVar(&c.cache, "cache", filepath.Join(home, ".cache", "faas-gpu", "cluster"),
		"cache of binaries, images and containerd's content (FAAS_GPU_CLUSTER_CACHE, as build-bins.sh and rootfs.sh)")
	fs.StringVar(&c.runDir, "run-dir", "/tmp/faas-gpu-cluster", "this run's state and logs, wiped at start")
	fs.StringVar(&c.k8sBin, "k8s-bin", "", "directory of the Kubernetes binaries (build-bins.sh k8s)")
	fs.StringVar(&c.knativeBin, "knative-bin", "", "directory of Knative Serving's controller, autoscaler and queue (build-bins.sh knative); empty: no Knative")
	fs.StringVar(&c.coredns, "coredns", "", "the CoreDNS binary (build-bins.sh coredns)")
	fs.StringVar(&c.etcd, "etcd", "/usr/bin/etcd", "the etcd binary (Debian's etcd-server)")
	fs.StringVar(&c.cniBin, "cni-bin", "/usr/lib/cni", "directory of the CNI plugins (Debian's containernetworking-plugins)")
	fs.StringVar(&c.rootfs, "rootfs", "", "the Debian base tarball of the images (rootfs.sh)")
	fs.StringVar(&c.faasGPU, "faas-gpu", "bin/faas-gpu", "the faas-gpu binary (make build)")
	fs.StringVar(&c.shim, "shim", "shim/build/libcuda.so.1", "the shim (make shim)")
	fns := fs.String("functions", "echo,hello-gpu,vector-add,mlp", "functions of ./functions to build gpu-python images of")
	// Every flag also reads FAAS_GPU_CLUSTER_<FLAG> (e.g. -k8s-bin: FAAS_GPU_CLUSTER_K8S_BIN); the flag wins.
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		name := "FAAS_GPU_CLUSTER_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s (flag -%s): %w", name, f.Name, err)
			}
		}
	})
	if envErr != nil {
		fmt.Fprintln(os.Stderr, "cluster:", envErr)
		return 2
	}
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	c.functions = strings.Split(*fns, ",")
	switch args[0] {
	case "down":
		if err := harness.Down(c.runDir, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "cluster down:", err)
			return 1
		}
		return 0
	case "run":
		if fs.NArg() == 0 {
			return usage()
		}
		for _, f := range []struct{ name, v string }{{"-k8s-bin", c.k8sBin}, {"-coredns", c.coredns}, {"-rootfs", c.rootfs}} {
			if f.v == "" {
				fmt.Fprintf(os.Stderr, "cluster run: %s is required\n", f.name)
				return 2
			}
		}
		return runCmd(c, fs.Args())
	default:
		return usage()
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[cluster %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func runCmd(c config, argv []string) (code int) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()

	specs, err := c.imageSpecs()
	if err != nil {
		logf("images: %v", err)
		return 1
	}
	archives, err := buildArchives(c.cache, specs)
	if err != nil {
		logf("images: %v", err)
		return 1
	}
	logf("%d images ready (%.1fs)", len(archives), time.Since(start).Seconds())

	info := harness.Info{RunDir: c.runDir, NodeIP: harness.NodeIP, Kubectl: filepath.Join(c.k8sBin, "kubectl"),
		Images: map[string]string{}, SocketDir: harness.SocketDir, RepositoryDir: harness.RepositoryDir}
	for _, s := range specs {
		info.Images[strings.TrimSuffix(strings.TrimPrefix(s.Ref, images.Registry+"/"), ":"+images.Tag)] = s.Ref
	}
	cfg := harness.Config{
		RunDir: c.runDir, ContainerdRoot: filepath.Join(c.cache, "containerd"), K8sBin: c.k8sBin, Etcd: c.etcd,
		CNIBin: c.cniBin, HostDirs: []string{harness.SocketDir, harness.RepositoryDir}, Log: os.Stderr,
	}
	defer func() {
		if err := harness.Down(c.runDir, os.Stderr); err != nil {
			logf("restoring the host: %v", err)
			code = 1
		}
		logf("logs of this run: %s/logs (total %.1fs)", c.runDir, time.Since(start).Seconds())
	}()
	cl, err := harness.Up(ctx, cfg)
	if err != nil {
		logf("start: %v", err)
		return 1
	}
	if err := importImages(ctx, cl, c.cache, archives); err != nil {
		logf("import: %v", err)
		return 1
	}
	if err := cl.Ready(ctx, info.Images["coredns"]); err != nil {
		logf("%v", err)
		return 1
	}
	if c.knativeBin != "" {
		kn, err := cl.StartKnative(ctx, filepath.Join(c.cache, "go", "mod"), harness.KnativeImages{
			Controller: info.Images["controller"], Autoscaler: info.Images["autoscaler"], Queue: info.Images["queue"],
		})
		if err != nil {
			logf("knative: %v", err)
			return 1
		}
		info.Knative = kn
	}
	info.Kubeconfig = cl.Kubeconfig
	infoPath := filepath.Join(c.runDir, "cluster.json")
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(infoPath, b, 0o644); err != nil {
		logf("%v", err)
		return 1
	}
	logf("cluster up %.1fs after start; running %s", time.Since(start).Seconds(), strings.Join(argv, " "))

	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cl.Kubeconfig, "FAAS_GPU_TEST_CLUSTER="+infoPath)
	// An interrupt reaches the command as SIGINT (go test then runs its cleanups); it is killed 60 s later.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 60 * time.Second
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		logf("%s exited with %d", argv[0], exit.ExitCode())
		return exit.ExitCode()
	default:
		logf("%s: %v", argv[0], err)
		return 1
	}
}

// imageSpecs lists every image the cluster and the tests use.
func (c config) imageSpecs() ([]imagebuild.Spec, error) {
	staticDir := filepath.Join(c.cache, "bin", "test")
	if err := os.MkdirAll(staticDir, 0o755); err != nil {
		return nil, err
	}
	// Static binaries from this module: the pause stand-in and NATS (the version go.mod pins).
	build := []struct{ out, pkg string }{
		{"pause", "./test/cluster/cmd/pause"},
		{"nats-server", "github.com/nats-io/nats-server/v2"},
	}
	for _, b := range build {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(staticDir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %v: %s", b.pkg, err, out)
		}
	}
	fg, err := images.FaasGPU(c.rootfs, c.faasGPU, c.shim)
	if err != nil {
		return nil, err
	}
	specs := []imagebuild.Spec{
		images.Static("pause", filepath.Join(staticDir, "pause")),
		images.Static("nats-server", filepath.Join(staticDir, "nats-server")),
		images.Static("coredns", c.coredns),
		fg,
	}
	if c.knativeBin != "" {
		for _, b := range []string{"controller", "autoscaler", "queue"} {
			s := images.Static(b, filepath.Join(c.knativeBin, b))
			// Knative's own images (ko on a distroless base) run as the nonroot user; the revision pods' queue-proxy
			// has runAsNonRoot.
			s.User = "65532:65532"
			specs = append(specs, s)
		}
	}
	for _, fn := range c.functions {
		s, err := images.GPUPython(c.rootfs, "templates/gpu-python", filepath.Join("functions", fn), fn)
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	return specs, nil
}

type archive struct {
	ref, key, path string
}

// buildArchives writes each image's archive to <cache>/images/, or reuses the one of the same key.
func buildArchives(cache string, specs []imagebuild.Spec) ([]archive, error) {
	dir := filepath.Join(cache, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var out []archive
	for _, s := range specs {
		key, err := s.Key()
		if err != nil {
			return nil, err
		}
		name := strings.NewReplacer("/", "_", ":", "_").Replace(strings.TrimPrefix(s.Ref, images.Registry+"/"))
		p := filepath.Join(dir, name+"-"+key+".tar")
		if _, err := os.Stat(p); err != nil {
			t := time.Now()
			if _, err := s.WriteArchive(p); err != nil {
				return nil, err
			}
			logf("built image %s (%.1fs)", s.Ref, time.Since(t).Seconds())
			// Older archives of the same image are stale.
			old, _ := filepath.Glob(filepath.Join(dir, name+"-*.tar"))
			for _, o := range old {
				if o != p {
					os.Remove(o)
				}
			}
		}
		out = append(out, archive{ref: s.Ref, key: key, path: p})
	}
	return out, nil
}

// importImages loads the archives into containerd's k8s.io namespace, skipping those imported before with the
// same key (containerd's content store is kept in the cache).
func importImages(ctx context.Context, cl *harness.Cluster, cache string, archives []archive) error {
	markerPath := filepath.Join(cache, "containerd-imported.json")
	imported := map[string]string{}
	if b, err := os.ReadFile(markerPath); err == nil {
		_ = json.Unmarshal(b, &imported)
	}
	present, err := cl.Ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, l := range strings.Split(present, "\n") {
		have[strings.TrimSpace(l)] = true
	}
	for _, a := range archives {
		if imported[a.ref] == a.key && have[a.ref] {
			continue
		}
		t := time.Now()
		if _, err := cl.Ctr(ctx, "images", "import", a.path); err != nil {
			return err
		}
		imported[a.ref] = a.key
		b, _ := json.Marshal(imported)
		if err := os.WriteFile(markerPath, b, 0o644); err != nil {
			return err
		}
		logf("imported %s into containerd (%.1fs)", a.ref, time.Since(t).Seconds())
	}
	return nil
}
