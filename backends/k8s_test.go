package backends_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/k8stest"
)

// The backend contract in a running pod (k8s://NAMESPACE/POD), through the
// Kubernetes API's exec.
func TestK8sContract(t *testing.T) {
	image := dockertest.Image(t)
	c := k8stest.ForTest(t, image)
	ctx := context.Background()
	if err := c.Namespace(ctx, "kd"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunPod(ctx, "kd", "box", image); err != nil {
		t.Fatal(err)
	}
	env, err := backends.Open("k8s://kd/box", backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.(*backends.K8s).Close() })
	backendtest.Contract(t, func(t *testing.T) backends.Env { return env })
	if n := env.(*backends.K8s).Relays(); n != 0 {
		t.Errorf("%d relay execs left open", n)
	}
}

// A k8s:// URI that names no pod, or has options it does not take, is a
// clear error before anything is reached.
func TestK8sURIErrors(t *testing.T) {
	for _, tc := range []struct{ uri, want string }{
		{"k8s://box", "a namespace and a pod"},
		{"k8s://Bad_NS/box", `"Bad_NS" is not a namespace name`},
		{"k8s://ns/Box!", `"Box!" is not a pod name`},
		{"k8s://ns/box?container=A_B", "container must be one container name"},
		{"k8s://ns/box?user=root", `unknown option "user"`},
	} {
		if _, err := backends.Open(tc.uri, backends.Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v, want an error with %q", tc.uri, err, tc.want)
		}
	}
	// A context's name may hold slashes (an EKS ARN): the pod and the
	// namespace are the last two parts. No such context: a clear error.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	_, err := backends.Open("k8s://arn:aws:eks:eu-west-1:1:cluster/prod/agents/box", backends.Options{})
	if err == nil || !strings.Contains(err.Error(), "arn:aws:eks:eu-west-1:1:cluster/prod") {
		t.Errorf("an unknown context: %v, want it named", err)
	}
}

// The backend contract in a pod the k8s-image backend made for a kernel
// (read-only root, its emptyDir /tmp, a user of the image's); Dispose
// deletes the pod, checked through the API.
func TestK8sImageContract(t *testing.T) {
	image := dockertest.Image(t)
	c := k8stest.ForTest(t, image)
	ctx := context.Background()
	if err := c.Namespace(ctx, "kdi"); err != nil {
		t.Fatal(err)
	}
	env, err := backends.Open("k8s-image://"+image+"?namespace=kdi&pull=Never&user=1001", backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := env.(*backends.PodSandbox)
	t.Cleanup(func() { b.Close() })
	host, err := b.Provision(ctx, "alice/default@k8s-image://x[]")
	if err != nil {
		t.Fatal(err)
	}
	pods := b.Pods()
	if len(pods) != 1 {
		t.Fatalf("the backend tracks %v, want one pod", pods)
	}
	backendtest.Contract(t, func(t *testing.T) backends.Env { return host })
	if err := host.(backends.Disposer).Dispose(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Pods("kdi").Get(ctx, pods[0], metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after Dispose, getting pod %s: %v, want not found", pods[0], err)
	}
	if left := b.Pods(); len(left) != 0 {
		t.Errorf("the backend still tracks %v", left)
	}
}

// A k8s-image:// URI with a bad option is a clear error before anything
// is reached.
func TestK8sImageURIErrors(t *testing.T) {
	for _, tc := range []struct{ uri, want string }{
		{"k8s-image://Bad Image?namespace=a", "not an image reference"},
		{"k8s-image://img?namespace=Bad_NS", `namespace "Bad_NS" is not a namespace name`},
		{"k8s-image://img?memory=lots", "memory must be a Kubernetes quantity"},
		{"k8s-image://img?memory=1Mi", "at least 16Mi"},
		{"k8s-image://img?cpu=-1", "cpu must be"},
		{"k8s-image://img?user=root", "numeric uid"},
		{"k8s-image://img?user=0", "numeric uid"},
		{"k8s-image://img?node_selector=zone", "KEY=VALUE"},
		{"k8s-image://img?node_selector=a=b,bad key=c", "KEY=VALUE"},
		{"k8s-image://img?pull=Sometimes", "pull must be Always, IfNotPresent or Never"},
		{"k8s-image://img?pids=100", "per node"},
		{"k8s-image://img?memory=1Gi&memory=2Gi", "given 2 times"},
		{"k8s-image://img?network=none", `unknown option "network"`},
		{"k8s-image://img?context=", "context must name"},
	} {
		if _, err := backends.Open(tc.uri, backends.Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v, want an error with %q", tc.uri, err, tc.want)
		}
	}
}

// An apiserver that refuses, or that never answers, is a clear error
// naming the server within the timeout, for both k8s backends; the
// kubeconfig's token appears in no error.
func TestK8sUnreachable(t *testing.T) {
	const token = "kd-secret-token-7f3a9c"
	kubeconfig := func(t *testing.T, server string) {
		path := filepath.Join(t.TempDir(), "config")
		cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: kd}}]
current-context: x
`, server, token)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("KUBECONFIG", path)
	}
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	for _, server := range []string{refusedAddr, silent.Addr().String()} {
		for _, uri := range []string{"k8s://kd/box", "k8s-image://img?namespace=kd"} {
			t.Run(uri+" "+server, func(t *testing.T) {
				kubeconfig(t, "https://"+server)
				_, err := backends.Open(uri, backends.Options{K8sTimeout: 2 * time.Second})
				if err == nil || !strings.Contains(err.Error(), server) {
					t.Fatalf("Open(%q) against %s: %v, want an error naming the server", uri, server, err)
				}
				if strings.Contains(err.Error(), token) {
					t.Fatalf("the token is in the error: %v", err)
				}
				t.Logf("%v", err)
			})
		}
	}
}

// A pod create whose answer never came (the engine closing just as its
// warm pool refilled) may have made the pod: the backend deletes it by
// name. Such a spare pod once outlived every engine.
func TestK8sImageCreateWithoutAnAnswerLeavesNoPod(t *testing.T) {
	image := dockertest.Image(t)
	c := k8stest.ForTest(t, image)
	ctx := context.Background()
	if err := c.Namespace(ctx, "kdlost"); err != nil {
		t.Fatal(err)
	}
	env, err := backends.Open("k8s-image://"+image+"?namespace=kdlost&pull=Never", backends.LosingCreateAnswers(backends.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	b := env.(*backends.PodSandbox)
	t.Cleanup(func() { b.Close() })
	if _, err := b.Provision(ctx, "spare-lost"); err == nil || !strings.Contains(err.Error(), "the answer was lost") {
		t.Fatalf("Provision: %v, want the lost answer", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := c.Client.CoreV1().Pods("kdlost").List(ctx, metav1.ListOptions{LabelSelector: backends.LabelManaged + "=1"})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a create without an answer left pod %s in the cluster", list.Items[0].Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
