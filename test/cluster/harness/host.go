package harness

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// hostState is what the host looked like before the cluster started, and what the harness changed on purpose. It is
// saved as the journal (journal.json in the run directory) before anything changes, so that `cluster down` can
// undo a run that was killed.
type hostState struct {
	// RunDir is the run's directory; CgroupRoot the kubelet's cgroup root below every controller.
	RunDir     string
	CgroupRoot string
	// Prefixes are the directories under which a mount made during the run is the cluster's.
	Prefixes []string
	// IPTables is iptables-save (and ip6tables-save) output before the run; NFTTables the nftables tables.
	IPTables  map[string]string
	NFTTables []string
	// Sysctls holds the writable kernel parameters a cluster may change, by /proc/sys path.
	Sysctls map[string]string
	// Mounts are the mount points before the run; Links the network links; NetNS the files in /run/netns.
	Mounts []string
	Links  []string
	NetNS  []string
	// Address is the address the harness put on lo ("" when it was there already).
	Address string
	// Created are the directories the harness created outside the run directory, removed at the end.
	Created []string
	// PIDs are the processes the harness started (process group leaders), by name.
	PIDs map[string]int
}

// sysctlRoots are the /proc/sys subtrees kubelet, kube-proxy, containerd and the CNI plugins write to.
var sysctlRoots = []string{"kernel", "vm", "net/ipv4", "net/ipv6/conf/all", "net/ipv6/conf/default", "net/bridge",
	"net/netfilter", "net/core"}

// sysctlSkip are parameters that change by themselves or cannot be read back.
var sysctlSkip = []string{"kernel/ns_last_pid", "kernel/random", "net/ipv4/conf/", "net/ipv4/neigh/", "net/ipv4/route/flush",
	"vm/drop_caches", "vm/compact_memory", "kernel/usermodehelper", "net/netfilter/nf_conntrack_count",
	"kernel/sysrq"}

// keptIPv4Conf are the per-interface IPv4 parameters kept: those of all, default and lo (others vanish with
// their interface).
var keptIPv4Conf = []string{"net/ipv4/conf/all/", "net/ipv4/conf/default/", "net/ipv4/conf/lo/"}

func snapshotSysctls() map[string]string {
	out := map[string]string{}
	for _, root := range sysctlRoots {
		_ = filepath.WalkDir(filepath.Join("/proc/sys", root), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			key := strings.TrimPrefix(p, "/proc/sys/")
			if skipSysctl(key) {
				return nil
			}
			info, err := d.Info()
			if err != nil || info.Mode().Perm()&0o200 == 0 {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			out[key] = strings.TrimSpace(string(b))
			return nil
		})
	}
	return out
}

func skipSysctl(key string) bool {
	for _, k := range keptIPv4Conf {
		if strings.HasPrefix(key, k) {
			return false
		}
	}
	for _, s := range sysctlSkip {
		if strings.HasPrefix(key, s) {
			return true
		}
	}
	return false
}

func mountPoints() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			out = append(out, unescapeMount(fields[4]))
		}
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func linkNames() []string {
	ents, _ := os.ReadDir("/sys/class/net")
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func netnsFiles() []string {
	ents, _ := os.ReadDir("/run/netns")
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func nftTables() []string {
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		return nil
	}
	return nonEmptyLines(string(out))
}

func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// snapshot records the host before the run.
func snapshot(runDir, cgroupRoot string, prefixes []string) (*hostState, error) {
	s := &hostState{RunDir: runDir, CgroupRoot: cgroupRoot, Prefixes: prefixes, IPTables: map[string]string{},
		PIDs: map[string]int{}}
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		out, err := exec.Command(tool).Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tool, err)
		}
		s.IPTables[tool] = string(out)
	}
	s.NFTTables = nftTables()
	s.Sysctls = snapshotSysctls()
	m, err := mountPoints()
	if err != nil {
		return nil, err
	}
	s.Mounts = m
	s.Links = linkNames()
	s.NetNS = netnsFiles()
	return s, nil
}

// restore undoes every host change recorded or visible since the snapshot; processes must be gone already. It
// goes on past errors and returns them all.
func (s *hostState) restore(logf func(string, ...any)) error {
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
			logf("restore: %v", err)
		}
	}

	// Mounts made under the cluster's directories (container rootfs, pod volumes, network namespaces): deepest
	// first, detached so that a busy one cannot stop the rest.
	before := map[string]bool{}
	for _, m := range s.Mounts {
		before[m] = true
	}
	now, err := mountPoints()
	note(err)
	var mine []string
	for _, m := range now {
		if !before[m] && s.isOurs(m) {
			mine = append(mine, m)
		}
	}
	sort.Slice(mine, func(i, j int) bool { return len(mine[i]) > len(mine[j]) })
	for _, m := range mine {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) &&
			!errors.Is(err, syscall.ENOENT) {
			note(fmt.Errorf("unmount %s: %w", m, err))
		} else {
			logf("restore: unmounted %s", m)
		}
	}
	// Network namespace files the pods' sandboxes left.
	oldNS := map[string]bool{}
	for _, n := range s.NetNS {
		oldNS[n] = true
	}
	for _, n := range netnsFiles() {
		// containerd's CRI names the pods' namespaces cni-<uuid>; others belong to someone else.
		if !oldNS[n] && strings.HasPrefix(n, "cni-") {
			p := filepath.Join("/run/netns", n)
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
			note(os.Remove(p))
			logf("restore: removed network namespace %s", n)
		}
	}
	// Links: the CNI bridge and the pods' veths.
	oldLinks := map[string]bool{}
	for _, l := range s.Links {
		oldLinks[l] = true
	}
	for _, l := range linkNames() {
		if !oldLinks[l] && (l == cniBridge || strings.HasPrefix(l, "veth")) {
			// A pod's veth goes with its network namespace, so it may be gone by now.
			if out, err := exec.Command("ip", "link", "delete", l).CombinedOutput(); err != nil &&
				!strings.Contains(string(out), "Cannot find device") {
				note(fmt.Errorf("ip link delete %s: %v: %s", l, err, out))
			} else {
				logf("restore: deleted link %s", l)
			}
		}
	}
	if s.Address != "" {
		if out, err := exec.Command("ip", "addr", "del", s.Address, "dev", "lo").CombinedOutput(); err != nil &&
			!strings.Contains(string(out), "Cannot assign") {
			note(fmt.Errorf("ip addr del %s dev lo: %v: %s", s.Address, err, out))
		} else {
			logf("restore: removed %s from lo", s.Address)
		}
	}
	// Packet filter: tables that did not exist go; the others get their saved rules back.
	oldTables := map[string]bool{}
	for _, t := range s.NFTTables {
		oldTables[t] = true
	}
	for _, t := range nftTables() {
		if !oldTables[t] {
			// "table ip nat" -> nft delete table ip nat
			args := append([]string{"delete"}, strings.Fields(t)...)
			if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
				note(fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, out))
			} else {
				logf("restore: removed nftables %s", t)
			}
		}
	}
	for tool, saved := range s.IPTables {
		restoreTool := strings.Replace(tool, "-save", "-restore", 1)
		if strings.TrimSpace(saved) == "" {
			continue
		}
		cmd := exec.Command(restoreTool)
		cmd.Stdin = strings.NewReader(saved)
		if out, err := cmd.CombinedOutput(); err != nil {
			note(fmt.Errorf("%s: %v: %s", restoreTool, err, out))
		} else {
			logf("restore: %s rules as saved", strings.TrimSuffix(tool, "-save"))
		}
	}
	// Kernel parameters.
	for key, old := range s.Sysctls {
		p := filepath.Join("/proc/sys", key)
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone with an interface
		}
		if cur := strings.TrimSpace(string(b)); cur != old {
			if err := os.WriteFile(p, []byte(old), 0o644); err != nil {
				note(fmt.Errorf("sysctl %s back to %q: %w", key, old, err))
			} else {
				logf("restore: sysctl %s %s -> %s", strings.ReplaceAll(key, "/", "."), cur, old)
			}
		}
	}
	// The kubelet's cgroups, leaves first.
	if s.CgroupRoot != "" {
		ctrls, _ := os.ReadDir("/sys/fs/cgroup")
		for _, c := range ctrls {
			root := filepath.Join("/sys/fs/cgroup", c.Name(), s.CgroupRoot)
			var dirs []string
			_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
			for _, d := range dirs {
				if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
					note(fmt.Errorf("rmdir %s: %w", d, err))
				}
			}
		}
		logf("restore: removed cgroup %s", s.CgroupRoot)
	}
	for i := len(s.Created) - 1; i >= 0; i-- {
		d := s.Created[i]
		if d == "/run/netns" {
			// Shared with every other user of network namespaces: removed only when nothing is left in it.
			if err := os.Remove(d); err == nil {
				logf("restore: removed %s", d)
			}
			continue
		}
		note(os.RemoveAll(d))
		logf("restore: removed %s", d)
	}
	return errors.Join(errs...)
}

func (s *hostState) isOurs(mount string) bool {
	if mount == "/run/netns" || strings.HasPrefix(mount, "/run/netns/cni-") {
		return true
	}
	for _, p := range s.Prefixes {
		if mount == p || strings.HasPrefix(mount, p+"/") {
			return true
		}
	}
	return false
}
