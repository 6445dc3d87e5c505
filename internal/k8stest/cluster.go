package k8stest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// tools are the commands those packages give, checked before a start.
var tools = map[string]string{
	"/usr/bin/etcd": "etcd-server", "/usr/bin/containerd": "containerd", "/usr/bin/ctr": "containerd",
	"/usr/sbin/runc": "runc", "/usr/lib/cni/bridge": "containernetworking-plugins", "/usr/lib/cni/host-local": "containernetworking-plugins",
	"/usr/lib/cni/loopback": "containernetworking-plugins", "/usr/sbin/ip": "iproute2",
}

// RequireEnv, set to 1, makes a machine that cannot run the cluster a test
// failure instead of a skip (CI sets it after building the binaries).
const RequireEnv = "KERNELDECK_REQUIRE_K8S"

// ErrUnavailable is what Start returns where this machine cannot run the
// cluster (not root, a package or the built binaries missing).
var ErrUnavailable = errors.New("k8stest: no cluster on this machine")

// Options shape a cluster.
type Options struct {
	// Images are Docker images of this machine loaded into the node's
	// containerd (pods name them with imagePullPolicy Never).
	Images []string
	// Log receives the cluster's progress; the components' own logs are
	// files in Dir.
	Log io.Writer
}

// Cluster is a running single-node cluster.
type Cluster struct {
	// Dir holds everything of the cluster's (0700): certificates, data,
	// the components' logs.
	Dir string
	// Kubeconfig is an admin's kubeconfig (system:masters).
	Kubeconfig string
	// Node is the node's name, NodeIP its address (192.0.2.0/24, on a
	// link of the cluster's own).
	Node, NodeIP string
	// Client is an admin client.
	Client kubernetes.Interface
	// Config is the admin's REST config.
	Config *rest.Config

	procs   []*exec.Cmd
	undo    []func() error // run in reverse at Close
	ctrSock string
	lock    *os.File
	log     io.Writer
}

// Start brings a cluster up: etcd, the apiserver, the scheduler, a private containerd
// (the images loaded) and a kubelet, until the node is Ready. Only one
// cluster runs on a machine at a time: a second Start waits.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the kubelet and containerd need root", ErrUnavailable)
	}
	var missing []string
	for path, pkg := range tools {
		if _, err := os.Stat(path); err != nil && !slices.Contains(missing, pkg) {
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("%w: apt-get install %s", ErrUnavailable, strings.Join(missing, " "))
	}
	bins := BinDir()
	if !built(bins) {
		return nil, fmt.Errorf("%w: kube-apiserver, kube-scheduler and kubelet %s are not built in %s (go run ./internal/k8stest/k8sbuild)", ErrUnavailable, Version, bins)
	}
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "kerneldeck-k8stest.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("k8stest: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return nil, fmt.Errorf("k8stest: lock: %w", err)
	}
	dir, err := os.MkdirTemp("", "kerneldeck-k8s-")
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("k8stest: %w", err)
	}
	c = &Cluster{Dir: dir, lock: lock, log: log}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	start := time.Now()
	step := func(what string) {
		fmt.Fprintf(log, "k8stest: %s (%v)\n", what, time.Since(start).Round(time.Millisecond))
	}

	suffix := make([]byte, 3)
	rand.Read(suffix)
	id := hex.EncodeToString(suffix)
	c.Node = "kd-" + id
	if err := c.hostSetup(id); err != nil {
		return c, err
	}
	step("node address " + c.NodeIP)

	pki := filepath.Join(dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		return c, err
	}
	ca, err := newAuthority(pki)
	if err != nil {
		return c, err
	}
	apiCrt, apiKey, err := ca.issue("apiserver", "kube-apiserver", nil, "127.0.0.1", c.NodeIP, "localhost", "kubernetes", "kubernetes.default.svc")
	if err != nil {
		return c, err
	}
	adminCrt, adminKey, err := ca.issue("admin", "kerneldeck-test-admin", []string{"system:masters"})
	if err != nil {
		return c, err
	}
	toKubelet, toKubeletKey, err := ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"})
	if err != nil {
		return c, err
	}
	schedCrt, schedKey, err := ca.issue("scheduler", "system:kube-scheduler", nil)
	if err != nil {
		return c, err
	}
	nodeCrt, nodeKey, err := ca.issue("node", "system:node:"+c.Node, []string{"system:nodes"})
	if err != nil {
		return c, err
	}
	kubeletCrt, kubeletKey, err := ca.issue("kubelet", c.Node, nil, c.NodeIP, c.Node)
	if err != nil {
		return c, err
	}
	saPub, saKey, err := serviceAccountKey(pki)
	if err != nil {
		return c, err
	}
	caFile := filepath.Join(pki, "ca.crt")

	ports, err := freePorts(5)
	if err != nil {
		return c, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	if err := c.run("etcd", "/usr/bin/etcd", "--name", "kd", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ports[1]), "--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ports[1]),
		"--initial-cluster", "kd=http://127.0.0.1:"+strconv.Itoa(ports[1]), "--log-level", "warn"); err != nil {
		return c, err
	}
	server := "https://127.0.0.1:" + strconv.Itoa(ports[2])
	if err := c.run("kube-apiserver", filepath.Join(bins, "kube-apiserver"),
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(ports[2]),
		"--advertise-address", c.NodeIP, "--service-cluster-ip-range", "10.96.0.0/24",
		"--client-ca-file", caFile, "--tls-cert-file", apiCrt, "--tls-private-key-file", apiKey,
		"--kubelet-client-certificate", toKubelet, "--kubelet-client-key", toKubeletKey,
		"--kubelet-certificate-authority", caFile, "--kubelet-preferred-address-types", "InternalIP",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", saPub,
		"--service-account-signing-key-file", saKey, "--authorization-mode", "Node,RBAC",
		"--enable-priority-and-fairness=false", "--profiling=false", "--v=1"); err != nil {
		return c, err
	}
	c.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := kubeconfig(c.Kubeconfig, server, caFile, adminCrt, adminKey); err != nil {
		return c, err
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return c, fmt.Errorf("k8stest: %w", err)
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return c, fmt.Errorf("k8stest: %w", err)
	}
	if err := c.waitFor(ctx, "the apiserver ready", time.Minute, func() (bool, error) {
		body, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	}); err != nil {
		return c, err
	}
	step("apiserver ready")

	// Pods that name no node are placed by the real scheduler (node
	// selectors, resources, "Unschedulable" in its own words).
	schedKubeconfig := filepath.Join(dir, "scheduler.kubeconfig")
	if err := kubeconfig(schedKubeconfig, server, caFile, schedCrt, schedKey); err != nil {
		return c, err
	}
	if err := c.run("kube-scheduler", filepath.Join(bins, "kube-scheduler"), "--kubeconfig", schedKubeconfig,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(ports[4]),
		"--profiling=false", "--v=1"); err != nil {
		return c, err
	}

	if err := c.startContainerd(ctx); err != nil {
		return c, err
	}
	step("containerd running")
	if err := c.loadImages(ctx, opts.Images); err != nil {
		return c, err
	}
	step("images loaded")

	nodeKubeconfig := filepath.Join(dir, "node.kubeconfig")
	if err := kubeconfig(nodeKubeconfig, server, caFile, nodeCrt, nodeKey); err != nil {
		return c, err
	}
	kcfg := filepath.Join(dir, "kubelet.yaml")
	if err := os.WriteFile(kcfg, []byte(kubeletConfig(c.NodeIP, ports[3], caFile, kubeletCrt, kubeletKey, c.ctrSock)), 0o600); err != nil {
		return c, err
	}
	if err := c.run("kubelet", filepath.Join(bins, "kubelet"), "--config", kcfg, "--kubeconfig", nodeKubeconfig,
		"--root-dir", filepath.Join(dir, "kubelet"), "--hostname-override", c.Node, "--node-ip", c.NodeIP, "--v=1"); err != nil {
		return c, err
	}
	if err := c.waitFor(ctx, "the node Ready", 2*time.Minute, func() (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return c, err
	}
	// The node lifecycle controller lifts the not-ready taint the kubelet
	// registers with; no controller-manager runs here.
	if err := c.waitFor(ctx, "the node untainted", time.Minute, func() (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		kept := n.Spec.Taints[:0]
		for _, t := range n.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(n.Spec.Taints) {
			return true, nil
		}
		n.Spec.Taints = kept
		_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	}); err != nil {
		return c, err
	}
	step("node Ready")
	return c, nil
}

// Namespace creates namespace name with its default service account (no
// controller-manager runs to make it).
func (c *Cluster) Namespace(ctx context.Context, name string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("k8stest: create namespace %s: %w", name, err)
	}
	no := false
	_, err = c.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}, AutomountServiceAccountToken: &no}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("k8stest: create namespace %s's default service account: %w", name, err)
	}
	return nil
}

// run starts a component with its output in Dir/name.log; Close stops it.
func (c *Cluster) run(name, path string, args ...string) error {
	logf, err := os.OpenFile(filepath.Join(c.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("k8stest: start %s: %w", name, err)
	}
	logf.Close()
	c.procs = append(c.procs, cmd)
	return nil
}

// waitFor polls ok until it holds, failing with the components' last log
// lines after within.
func (c *Cluster) waitFor(ctx context.Context, what string, within time.Duration, ok func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		done, err := ok()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		for _, p := range c.procs {
			if p.ProcessState != nil {
				return fmt.Errorf("k8stest: %s exited while waiting for %s:\n%s", filepath.Base(p.Path), what, c.logTail(filepath.Base(p.Path)))
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			var tails []string
			for _, p := range c.procs {
				tails = append(tails, c.logTail(filepath.Base(p.Path)))
			}
			return fmt.Errorf("k8stest: no %s within %v:\n%s", what, within, strings.Join(tails, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) logTail(name string) string {
	data, _ := os.ReadFile(filepath.Join(c.Dir, name+".log"))
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "--- " + name + ":\n" + strings.Join(lines, "\n")
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// command runs a host command, its output in the error.
func command(ctx context.Context, stdin io.Reader, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("k8stest: %s %s: %w: %s", name, strings.Join(args, " "), err, tail(out.String(), 1000))
	}
	return nil
}

// RunPod creates a pod on the node running image's sleep (no service
// account token, the test image's own user) and waits until it runs.
func (c *Cluster) RunPod(ctx context.Context, namespace, name, image string) (*corev1.Pod, error) {
	no := false
	return c.StartPod(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "box", Image: image, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "infinity"},
			}},
		},
	})
}

// StartPod creates pod and waits until it runs.
func (c *Cluster) StartPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	namespace, name := pod.Namespace, pod.Name
	if _, err := c.Client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("k8stest: create pod %s/%s: %w", namespace, name, err)
	}
	for {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			return p, nil
		}
		if ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("phase %s: %+v", p.Status.Phase, p.Status.ContainerStatuses)
			}
			return nil, fmt.Errorf("k8stest: pod %s/%s is not running: %w", namespace, name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
