package k8stest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// sysctls the kubelet sets on start; Close puts them back.
var sysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// hostSetup gives the node an address of its own (the kubelet refuses
// loopback) from the documentation range that is never routed, on a link
// of its own (a bridge with no ports: this machine's kernel has no dummy
// links), and notes what the kubelet changes on the host so that Close
// can put it back.
func (c *Cluster) hostSetup(id string) error {
	for _, s := range sysctls {
		p := "/proc/sys/" + s
		if old, err := os.ReadFile(p); err == nil {
			c.undo = append(c.undo, func() error { return os.WriteFile(p, old, 0o644) })
		}
	}
	if saved, err := exec.Command("iptables-save").Output(); err == nil {
		c.undo = append(c.undo, func() error {
			return command(context.Background(), strings.NewReader(string(saved)), "iptables-restore")
		})
	}
	used := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ip, _, err := net.ParseCIDR(a.String()); err == nil {
				used[ip.String()] = true
			}
		}
	}
	b := []byte(id)
	for i := 0; i < 250; i++ {
		ip := fmt.Sprintf("192.0.2.%d", 2+(int(b[0])+int(b[1])*7+i)%250)
		if !used[ip] {
			c.NodeIP = ip
			break
		}
	}
	if c.NodeIP == "" {
		return errors.New("k8stest: no free address in 192.0.2.0/24")
	}
	link := "kd" + id
	ctx := context.Background()
	if err := command(ctx, nil, "ip", "link", "add", link, "type", "bridge"); err != nil {
		return err
	}
	c.undo = append(c.undo, func() error { return command(ctx, nil, "ip", "link", "del", link) })
	if err := command(ctx, nil, "ip", "addr", "add", c.NodeIP+"/32", "dev", link); err != nil {
		return err
	}
	return command(ctx, nil, "ip", "link", "set", link, "up")
}

// startContainerd starts a containerd of the cluster's own (its socket,
// root and state under Dir), with a bridge network that only reaches the
// node (no gateway, no masquerade).
func (c *Cluster) startContainerd(ctx context.Context) error {
	cd := filepath.Join(c.Dir, "containerd")
	cni := filepath.Join(c.Dir, "cni")
	for _, d := range []string{cd, cni} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	c.ctrSock = filepath.Join(cd, "containerd.sock")
	bridge := "kdbr" + strings.TrimPrefix(c.Node, "kd-")
	conflist := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "kd", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": false, "ipMasq": false, "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "dataDir": %q}},
  {"type": "loopback"}]}
`, bridge, filepath.Join(c.Dir, "ipam"))
	if err := os.WriteFile(filepath.Join(cni, "10-kd.conflist"), []byte(conflist), 0o600); err != nil {
		return err
	}
	c.undo = append(c.undo, func() error {
		if _, err := net.InterfaceByName(bridge); err != nil {
			return nil
		}
		return command(context.Background(), nil, "ip", "link", "del", bridge)
	})
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(cd, "root"), filepath.Join(cd, "state"), c.ctrSock, c.ctrSock+".ttrpc", pauseRef, cni, filepath.Join(cd, "opt"))
	cfg := filepath.Join(cd, "config.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		return err
	}
	if err := c.run("containerd", "/usr/bin/containerd", "--config", cfg); err != nil {
		return err
	}
	return c.waitFor(ctx, "containerd's socket", 30*time.Second, func() (bool, error) {
		conn, err := net.Dial("unix", c.ctrSock)
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	})
}

// pauseRef is the pod sandbox's image: the first image loaded, retagged
// (see loadImages), whose process only waits.
const pauseRef = "docker.io/library/kerneldeck-pause:1"

// loadImages loads Docker images of this machine into the node's
// containerd (no registry here), and a pause image made from the first.
func (c *Cluster) loadImages(ctx context.Context, images []string) error {
	if len(images) == 0 {
		return errors.New("k8stest: Options.Images is empty; the pod sandbox image is made from the first")
	}
	build := exec.CommandContext(ctx, "docker", "build", "-q", "-t", "kerneldeck-pause:1", "-")
	build.Stdin = strings.NewReader("FROM " + images[0] + "\nENTRYPOINT [\"sleep\", \"infinity\"]\nCMD []\n")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("k8stest: docker build the pause image: %w: %s", err, out)
	}
	save := exec.CommandContext(ctx, "docker", append([]string{"save", "kerneldeck-pause:1"}, images...)...)
	out, err := save.StdoutPipe()
	if err != nil {
		return err
	}
	var saveErr strings.Builder
	save.Stderr = &saveErr
	if err := save.Start(); err != nil {
		return fmt.Errorf("k8stest: docker save: %w", err)
	}
	importErr := command(ctx, out, "ctr", "-a", c.ctrSock, "-n", "k8s.io", "images", "import", "--no-unpack=false", "-")
	io.Copy(io.Discard, out)
	if err := save.Wait(); err != nil {
		return fmt.Errorf("k8stest: docker save %v: %w: %s", images, err, saveErr.String())
	}
	return importErr
}

// kubeletConfig is the kubelet's configuration: cgroup v1 with the cgroupfs
// driver (this machine's), client certificates only, no iptables chains
// of its own, and no eviction for this machine's disk.
func kubeletConfig(ip string, port int, ca, crt, key, sock string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
tlsCertFile: %s
tlsPrivateKeyFile: %s
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
serializeImagePulls: false
registerNode: true
`, ip, port, ca, crt, key, sock)
}

// Close stops the cluster and puts the host back: every pod's processes
// killed, the components stopped, every mount under Dir undone, the links
// removed, the kubelet's sysctls and iptables rules restored, Dir removed.
func (c *Cluster) Close() error {
	var errs []error
	t0 := time.Now()
	stop := func(name string, sig syscall.Signal) {
		for _, p := range c.procs {
			if filepath.Base(p.Path) != name || p.ProcessState != nil {
				continue
			}
			p.Process.Signal(sig)
			done := make(chan struct{})
			go func() { p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}
		fmt.Fprintf(c.log, "k8stest: %s stopped (%v)\n", name, time.Since(t0).Round(time.Millisecond))
	}
	// The scheduler first: the apiserver's shutdown would wait on its
	// watches.
	stop("kube-scheduler", syscall.SIGKILL)
	stop("kubelet", syscall.SIGTERM)
	// Nothing of the node's is kept: containerd goes at once, and its
	// shims (which outlive it by design) with every process they started.
	stop("containerd", syscall.SIGKILL)
	if c.ctrSock != "" {
		killShims(c.ctrSock)
	}
	stop("kube-apiserver", syscall.SIGTERM)
	stop("etcd", syscall.SIGTERM)
	if c.Dir != "" {
		errs = append(errs, unmountUnder(c.Dir))
	}
	errs = append(errs, removeCgroups("kubepods"))
	for i := len(c.undo) - 1; i >= 0; i-- {
		errs = append(errs, c.undo[i]())
	}
	if c.Dir != "" {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	if c.lock != nil {
		c.lock.Close()
	}
	return errors.Join(errs...)
}

// killShims kills the shims of the containerd at sock, and everything
// they started (a container's processes are the shim's descendants), and
// waits until they are gone.
func killShims(sock string) {
	parent := map[int]int{}
	var shims []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid := 0
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := strings.LastIndexByte(string(stat), ')'); i >= 0 {
				var state string
				var ppid int
				fmt.Sscan(string(stat[i+1:]), &state, &ppid)
				parent[pid] = ppid
			}
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmdline), "containerd-shim") && strings.Contains(string(cmdline), sock) {
			shims = append(shims, pid)
		}
	}
	doomed := map[int]bool{}
	for _, s := range shims {
		doomed[s] = true
	}
	for grew := true; grew; {
		grew = false
		for pid, pp := range parent {
			if doomed[pp] && !doomed[pid] {
				doomed[pid], grew = true, true
			}
		}
	}
	for pid := range doomed {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left := 0
		for pid := range doomed {
			if syscall.Kill(pid, 0) == nil {
				left++
			}
		}
		if left == 0 {
			return
		}
	}
}

// unmountUnder undoes every mount under dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			mounts = append(mounts, fields[4])
		}
	}
	f.Close()
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("k8stest: unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes the kubelet's cgroup tree (empty once its pods
// are gone) from every v1 controller, deepest first.
func removeCgroups(name string) error {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + name)
	var errs []error
	for _, root := range roots {
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("k8stest: remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}
