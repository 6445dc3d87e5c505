package k8stest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/k8stest"
)

// The cluster runs a pod of the test image with a memory limit, a command
// runs in it over an exec stream with stdin, and Close leaves nothing
// behind: no process of the node's, no mount, no link.
func TestK8sAPodRunsAndNothingIsLeft(t *testing.T) {
	image := dockertest.Image(t)
	before := hostState()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log bytes.Buffer
	c, err := k8stest.Start(ctx, k8stest.Options{Images: []string{image}, Log: &log})
	if errors.Is(err, k8stest.ErrUnavailable) && os.Getenv(k8stest.RequireEnv) != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	t.Logf("%s", log.String())
	if err := c.Namespace(ctx, "kd-test"); err != nil {
		t.Fatal(err)
	}
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "box", Namespace: "kd-test"},
		Spec: corev1.PodSpec{
			NodeName:                     c.Node,
			AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{
				Name: "box", Image: image, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sleep", "infinity"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}},
			}},
		},
	}
	start := time.Now()
	if _, err := c.Client.CoreV1().Pods("kd-test").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		p, err := c.Client.CoreV1().Pods("kd-test").Get(ctx, "box", metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the pod is not running: %+v %v", p.Status, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("pod running %v after its create", time.Since(start).Round(time.Millisecond))

	req := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace("kd-test").Name("box").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "box", Command: []string{"python3", "-c", "import sys; print(sum(map(int, sys.stdin.read().split())))"},
			Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	exec, err := remotecommand.NewSPDYExecutor(c.Config, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader("40 2\n"), Stdout: &stdout, Stderr: &stderr}); err != nil {
		t.Fatalf("exec: %v (%s)", err, stderr.String())
	}
	if stdout.String() != "42\n" {
		t.Fatalf("exec printed %q, want 42 (stderr %q)", stdout.String(), stderr.String())
	}

	dir, node := c.Dir, c.Node
	closed = true
	start = time.Now()
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close took %v:\n%s", time.Since(start).Round(time.Millisecond), log.String())
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's dir %s is still there: %v", dir, err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), dir) {
		t.Errorf("mounts under %s are left", dir)
	}
	if _, err := net.InterfaceByName("kd" + strings.TrimPrefix(node, "kd-")); err == nil {
		t.Errorf("the node's link is left")
	}
	if after := hostState(); after != before {
		t.Errorf("the host is not as it was: before\n%s\nafter\n%s", before, after)
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		cmdline, _ := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if strings.Contains(string(cmdline), dir) {
			t.Errorf("process %s is left: %q", p.Name(), strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
}

// hostState is what the kubelet changes on the host: its sysctls and the
// iptables rules (without their counters).
func hostState() string {
	var b strings.Builder
	for _, s := range []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} {
		v, _ := os.ReadFile("/proc/sys/" + s)
		fmt.Fprintf(&b, "%s=%s", s, v)
	}
	rules, _ := exec.Command("iptables-save").Output()
	for _, line := range strings.Split(string(rules), "\n") {
		if !strings.HasPrefix(line, "#") {
			b.WriteString(counters.ReplaceAllString(line, "") + "\n")
		}
	}
	return b.String()
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)
