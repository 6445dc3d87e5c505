package backends

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/klog/v2"
)

// DefaultK8sTimeout bounds reaching the Kubernetes API and the checks made
// when a k8s backend is opened.
const DefaultK8sTimeout = 15 * time.Second

// K8s runs kernels inside a running pod (k8s://[CONTEXT/]NAMESPACE/POD
// [?container=C]) through the Kubernetes API: a command is one exec with
// stdin; a stream is one long-lived exec relaying between its stdin and
// stdout and a Unix socket in the container, as for docker://.
type K8s struct {
	uri       string
	namespace string
	pod       string
	container string
	tempDir   string
	cfg       *rest.Config
	core      *rest.RESTClient // the core/v1 API
	params    runtime.ParameterCodec
	// gone says, without asking the API, why the pod is gone or going
	// ("" while it runs); nil where nothing follows the pod.
	gone func() string

	mu     sync.Mutex
	relays map[*k8sRelay]struct{}
	closed bool
}

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
)

// parseK8sURI splits k8s://[CONTEXT/]NAMESPACE/POD[?container=C]; a
// context may hold slashes itself (an EKS ARN does), so the pod and the
// namespace are taken from the right.
func parseK8sURI(uri string) (kubeContext, namespace, pod, container string, err error) {
	usage := "want k8s://[CONTEXT/]NAMESPACE/POD[?container=NAME]"
	rest, ok := strings.CutPrefix(uri, "k8s://")
	if !ok {
		return "", "", "", "", fmt.Errorf("backend %q: %s", uri, usage)
	}
	path, query, _ := strings.Cut(rest, "?")
	parts := strings.Split(path, "/")
	if len(parts) < 2 {
		return "", "", "", "", fmt.Errorf("backend %q: %s (a namespace and a pod)", uri, usage)
	}
	pod, namespace = parts[len(parts)-1], parts[len(parts)-2]
	kubeContext = strings.Join(parts[:len(parts)-2], "/")
	if len(namespace) > 63 || !dnsLabel.MatchString(namespace) {
		return "", "", "", "", fmt.Errorf("backend %q: %q is not a namespace name (%s)", uri, namespace, usage)
	}
	if len(pod) > 253 || !dnsSubdomain.MatchString(pod) {
		return "", "", "", "", fmt.Errorf("backend %q: %q is not a pod name (%s)", uri, pod, usage)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", "", "", "", fmt.Errorf("backend %q: %v (%s)", uri, err, usage)
	}
	for k, v := range q {
		switch {
		case k == "container" && len(v) == 1 && len(v[0]) <= 63 && dnsLabel.MatchString(v[0]):
			container = v[0]
		case k == "container":
			return "", "", "", "", fmt.Errorf("backend %q: container must be one container name of the pod", uri)
		default:
			return "", "", "", "", fmt.Errorf("backend %q: unknown option %q; k8s:// takes only container=", uri, k)
		}
	}
	return kubeContext, namespace, pod, container, nil
}

// k8sConfig reads the client config as kubectl does: KUBECONFIG (a list of
// files) or ~/.kube/config, the context given or the current one; in a pod
// with no kubeconfig, the pod's own service account.
// It also returns the context's namespace ("" where it names none).
func k8sConfig(kubeContext string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext})
	cfg, err := cc.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		// client-go's own words name KUBERNETES_MASTER, which kubectl
		// users never set.
		return nil, "", errors.New("no Kubernetes client config: set KUBECONFIG to a kubeconfig file, or write ~/.kube/config " +
			"(as kubectl does), or run kerneldeck in a pod with a service account")
	}
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client config (KUBECONFIG, ~/.kube/config or in-cluster): %w", err)
	}
	cfg.UserAgent = "kerneldeck"
	namespace, _, err := cc.Namespace()
	if err != nil {
		namespace = ""
	}
	return cfg, namespace, nil
}

// quietClientGo sends client-go's own log nowhere: it prints errors it
// handles itself (a stream closed from this side, a ping after it) on
// stderr, across a dashboard's screen. kerneldeck reports what fails.
var quietClientGo = sync.OnceFunc(func() { klog.SetLogger(logr.Discard()) })

// NewK8s opens k8s://[CONTEXT/]NAMESPACE/POD[?container=C]: it checks the
// pod runs and reads the container's temp dir ($TMPDIR, else /tmp).
func NewK8s(uri string, opts Options) (*K8s, error) {
	quietClientGo()
	kubeContext, namespace, pod, container, err := parseK8sURI(uri)
	if err != nil {
		return nil, err
	}
	cfg, _, err := k8sConfig(kubeContext)
	if err != nil {
		return nil, fmt.Errorf("k8s %s: %w", uri, err)
	}
	core, params, err := coreClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("k8s %s: %w", uri, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(opts.K8sTimeout, DefaultK8sTimeout))
	defer cancel()
	return openPod(ctx, cfg, core, params, uri, namespace, pod, container, opts.DockerTempDir)
}

// coreClient is a client of the core/v1 API alone. client-go's clientset
// registers every API group of Kubernetes when the program starts (with
// the rest of client-go's, some 16 ms before anything runs, in every
// kerneldeck process, a k8s backend or not): only core/v1 is needed.
func coreClient(cfg *rest.Config) (*rest.RESTClient, runtime.ParameterCodec, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	c := rest.CopyConfig(cfg)
	c.APIPath, c.GroupVersion = "/api", &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, nil, err
	}
	return rc, runtime.NewParameterCodec(scheme), nil
}

// openPod is NewK8s on a client the caller has.
func openPod(ctx context.Context, cfg *rest.Config, core *rest.RESTClient, params runtime.ParameterCodec, uri, namespace, pod, container, tempDir string) (*K8s, error) {
	p := &corev1.Pod{}
	err := core.Get().Namespace(namespace).Resource("pods").Name(pod).Do(ctx).Into(p)
	if err != nil {
		hint := apiHint(err, namespace)
		if apierrors.IsNotFound(err) {
			hint = fmt.Sprintf(" (kubectl get pods -n %s lists them)", namespace)
		}
		return nil, fmt.Errorf("k8s %s: pod %s/%s: %w%s", uri, namespace, pod, err, hint)
	}
	if p.Status.Phase != corev1.PodRunning {
		return nil, fmt.Errorf("k8s %s: pod %s/%s is %s, not Running", uri, namespace, pod, p.Status.Phase)
	}
	if container == "" {
		container = p.Spec.Containers[0].Name
	} else if !hasContainer(p, container) {
		return nil, fmt.Errorf("k8s %s: pod %s/%s has no container %q", uri, namespace, pod, container)
	}
	k := &K8s{uri: uri, namespace: namespace, pod: pod, container: container, cfg: cfg, core: core, params: params, relays: map[*k8sRelay]struct{}{}}
	probe := `printf 'KDTMP %s\n' "${TMPDIR:-/tmp}"`
	if tempDir != "" {
		probe = `printf 'KDTMP %s\n' ` + ShellQuote(tempDir)
	}
	res, err := k.Execute(ctx, probe, ExecOptions{})
	if err != nil {
		return nil, err
	}
	line, _, _ := strings.Cut(res.Output, "\n")
	tmp, ok := strings.CutPrefix(line, "KDTMP ")
	if res.ReturnCode != 0 || !ok || !strings.HasPrefix(tmp, "/") {
		return nil, fmt.Errorf("k8s %s: cannot run bash in container %s of pod %s/%s (exit %d): %s", uri, container, namespace, pod, res.ReturnCode, strings.TrimSpace(res.Output))
	}
	k.tempDir = tmp
	return k, nil
}

func hasContainer(p *corev1.Pod, name string) bool {
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// URI implements Env.
func (k *K8s) URI() string { return k.uri }

// TempDir implements Env.
func (k *K8s) TempDir() string { return k.tempDir }

// Pod names the pod the kernels run in, as namespace/name.
func (k *K8s) Pod() string { return k.namespace + "/" + k.pod }

// Execute implements Env with one exec per command.
func (k *K8s) Execute(ctx context.Context, command string, opts ExecOptions) (Result, error) {
	return runShell(ctx, k8sShell{k}, command, opts)
}

// Close ends the streams still open (their relays exit with them) and
// waits a moment for their execs to end.
func (k *K8s) Close() error {
	k.mu.Lock()
	k.closed = true
	relays := make([]*k8sRelay, 0, len(k.relays))
	for r := range k.relays {
		relays = append(relays, r)
	}
	k.mu.Unlock()
	for _, r := range relays {
		r.Close()
	}
	for _, r := range relays {
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
		}
	}
	return nil
}

// executor is one exec of cmd in the container, over WebSocket where the
// apiserver speaks it and SPDY where it does not (as kubectl does).
func (k *K8s) executor(cmd []string, stdin bool) (remotecommand.Executor, error) {
	req := k.core.Post().Resource("pods").Namespace(k.namespace).Name(k.pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: k.container, Command: cmd, Stdin: stdin, Stdout: true, Stderr: true}, k.params)
	spdy, err := remotecommand.NewSPDYExecutor(k.cfg, "POST", req.URL())
	if err != nil {
		return nil, fmt.Errorf("k8s %s: exec: %w", k.uri, err)
	}
	ws, err := remotecommand.NewWebSocketExecutor(k.cfg, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("k8s %s: exec: %w", k.uri, err)
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// k8sShell is the pod's container as a shellTransport.
type k8sShell struct{ k *K8s }

func (t k8sShell) name() string { return "k8s " + t.k.uri }

func (t k8sShell) start(ctx context.Context, cmdline string, stdin []byte, stdout, stderr io.Writer) (shellProcess, error) {
	if err := t.k.goneErr(); err != nil {
		return nil, notStarted{err}
	}
	// The command gets exactly the stdin bytes through head: the end of
	// an exec's stdin does not always reach the command (seen here once
	// in a few runs: a sha256sum waiting for it). And an exec's output
	// ends only once its stdin was all taken (the runtime's copy into the
	// command waits on a full pipe), so what the command leaves unread is
	// read to its end after it.
	cmdline = fmt.Sprintf("head -c %d | ( %s\nrc=$?; cat >/dev/null; exit $rc ); exit ${PIPESTATUS[1]}", len(stdin), strings.TrimPrefix(cmdline, "exec "))
	ex, err := t.k.executor([]string{"bash", "--norc", "--noprofile", "-c", cmdline}, true)
	if err != nil {
		return nil, err
	}
	p := &k8sProcess{k: t.k, done: make(chan struct{})}
	sctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	go func() {
		defer close(p.done)
		p.err = ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: bytes.NewReader(stdin), Stdout: stdout, Stderr: stderr})
	}()
	return p, nil
}

// k8sProcess is one exec.
type k8sProcess struct {
	k      *K8s
	done   chan struct{}
	err    error
	cancel context.CancelFunc
}

func (p *k8sProcess) wait() (int, error) {
	<-p.done
	var exit utilexec.CodeExitError
	switch {
	case p.err == nil:
		return 0, nil
	case errors.As(p.err, &exit):
		return exit.ExitStatus(), nil
	}
	return 0, p.k.execErr(p.err)
}

// goneErr is ErrHostGone, wrapped with why, when the pod is known to be
// gone or going without asking the API; else nil.
func (k *K8s) goneErr() error {
	if k.gone == nil {
		return nil
	}
	if why := k.gone(); why != "" {
		return fmt.Errorf("k8s %s: pod %s/%s %s (%w)", k.uri, k.namespace, k.pod, why, ErrHostGone)
	}
	return nil
}

// execErr says why an exec failed, naming a pod that is gone, going or
// ended: the engine reports its kernels' state as lost instead of trying
// again until a cell's timeout.
func (k *K8s) execErr(err error) error {
	why := ""
	if k.gone != nil {
		why = k.gone()
	}
	if why == "" {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultK8sTimeout)
		p := &corev1.Pod{}
		gerr := k.core.Get().Namespace(k.namespace).Resource("pods").Name(k.pod).Do(ctx).Into(p)
		cancel()
		why = podGone(p, gerr, k.container)
	}
	if why != "" {
		return fmt.Errorf("k8s %s: pod %s/%s %s (%w): %v", k.uri, k.namespace, k.pod, why, ErrHostGone, err)
	}
	return fmt.Errorf("k8s %s: exec: %w", k.uri, err)
}

// podGone says why a pod (or the error getting it) means it is gone for
// good, or "" while it runs.
func podGone(p *corev1.Pod, err error, container string) string {
	switch {
	case apierrors.IsNotFound(err):
		return "is gone"
	case err != nil:
		return ""
	case p.DeletionTimestamp != nil:
		return "is being deleted"
	case p.Status.Reason == "Evicted":
		return "was evicted: " + p.Status.Message
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		return fmt.Sprintf("has ended (%s)", p.Status.Phase)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; cs.Name == container && t != nil {
			return fmt.Sprintf("has its container %s ended (%s, exit %d)", container, cmp.Or(t.Reason, "terminated"), t.ExitCode)
		}
	}
	return ""
}

func (p *k8sProcess) close() { p.cancel() }

func (t k8sShell) killGroup(pgid int) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultK8sTimeout)
	defer cancel()
	ex, err := t.k.executor([]string{"bash", "--norc", "--noprofile", "-c", fmt.Sprintf("kill -KILL -- -%d 2>/dev/null", pgid)}, false)
	if err != nil {
		return
	}
	ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: io.Discard})
}

// DialUnix implements StreamDialer: one exec running the relay, its stdin
// and stdout the stream.
func (k *K8s) DialUnix(ctx context.Context, path string) (net.Conn, error) {
	k.mu.Lock()
	closed := k.closed
	k.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("k8s %s: closed", k.uri)
	}
	if err := k.goneErr(); err != nil {
		return nil, err
	}
	ex, err := k.executor([]string{"python3", "-I", "-S", "-c", relaySource, path}, true)
	if err != nil {
		return nil, err
	}
	// The engine's end is a pipe pair: writes go to the exec's stdin,
	// reads come from its stdout (through the deadline wrapper).
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &k8sRelay{k: k, in: inW, out: outR, cancel: cancel, done: make(chan struct{})}
	stderr := &headWriter{max: 300}
	go func() {
		defer close(r.done)
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: stderr})
		outW.CloseWithError(cmp.Or(err, io.EOF))
		inR.Close()
	}()
	br := bufio.NewReader(outR)
	ack := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		ack <- strings.TrimSpace(line)
	}()
	select {
	case line := <-ack:
		if line != "KDRELAY OK" {
			r.Close()
			<-r.done
			msg := strings.TrimPrefix(line, "KDRELAY ERR ")
			if msg == "" {
				msg, _, _ = strings.Cut(strings.TrimSpace(stderr.String()), "\n")
			}
			return nil, fmt.Errorf("k8s %s: open stream to %s: %s", k.uri, path, cmp.Or(msg, "the relay ended"))
		}
	case <-ctx.Done():
		r.Close()
		return nil, fmt.Errorf("k8s %s: open stream to %s: %w", k.uri, path, ctx.Err())
	}
	r.br = br
	k.mu.Lock()
	k.relays[r] = struct{}{}
	k.mu.Unlock()
	return withReadDeadlines(r), nil
}

// Relays counts the streams open now (for tests that check nothing is
// left running).
func (k *K8s) Relays() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.relays)
}

// k8sRelay is a stream through the relay exec, without deadlines of its
// own.
type k8sRelay struct {
	k      *K8s
	in     *io.PipeWriter
	out    *io.PipeReader
	br     *bufio.Reader // out, after the relay's first line
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func (r *k8sRelay) Read(p []byte) (int, error)  { return r.br.Read(p) }
func (r *k8sRelay) Write(p []byte) (int, error) { return r.in.Write(p) }

// CloseWrite ends the relay's stdin: the runner sees the end and can still
// answer.
func (r *k8sRelay) CloseWrite() error { return r.in.Close() }

// Close ends the relay: its stdin closes and it exits; the exec ends
// (waited for a moment, so that no stream outlives its kernel).
func (r *k8sRelay) Close() error {
	r.once.Do(func() {
		r.in.Close()
		r.out.Close()
		r.cancel()
		r.k.mu.Lock()
		delete(r.k.relays, r)
		r.k.mu.Unlock()
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
		}
	})
	return nil
}

func (r *k8sRelay) LocalAddr() net.Addr              { return k8sAddr(r.k.uri) }
func (r *k8sRelay) RemoteAddr() net.Addr             { return k8sAddr(r.k.uri) }
func (r *k8sRelay) SetDeadline(time.Time) error      { return nil }
func (r *k8sRelay) SetReadDeadline(time.Time) error  { return nil }
func (r *k8sRelay) SetWriteDeadline(time.Time) error { return nil }

type k8sAddr string

func (a k8sAddr) Network() string { return "k8s-exec" }
func (a k8sAddr) String() string  { return string(a) }
