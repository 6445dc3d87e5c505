package backends

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Defaults of a per-kernel pod.
const (
	DefaultPodMemory = "512Mi"
	// DefaultPodStart bounds a pod's create to its container running.
	DefaultPodStart = time.Minute
	// unschedulableWait is how long a pod may stay unschedulable before
	// its spawn fails with the scheduler's words: long enough for an
	// evicted kernel's pod to make room.
	unschedulableWait = 5 * time.Second
	podTmpSize        = "256Mi"
	podContainer      = "kernel"
)

// fatalWaiting are the reasons a container waits that no wait will mend,
// each with what to do.
var fatalWaiting = map[string]string{
	"ErrImageNeverPull":          "the image is not on the node and pull=Never: load it there, or let the node pull it (pull=IfNotPresent)",
	"ErrImagePull":               "the node could not pull the image: check its name, the registry and the namespace's pull secrets",
	"ImagePullBackOff":           "the node could not pull the image: check its name, the registry and the namespace's pull secrets",
	"InvalidImageName":           "the image reference is not valid",
	"CreateContainerConfigError": "the container's config is refused: check user= against the image",
	"CreateContainerError":       "the runtime could not create the container",
	"RunContainerError":          "the runtime could not start the container: the image must have sleep, bash and python3",
	"CrashLoopBackOff":           "the container keeps exiting: the image must have sleep, bash and python3",
}

// PodSandbox is the k8s-image://IMAGE backend: one pod per kernel, created
// from IMAGE at the kernel's spawn with limits (no service-account token,
// no capabilities, no privilege escalation, a read-only root with an
// emptyDir /tmp), and deleted when the kernel goes. One watch follows the
// pods, so a kernel whose pod is deleted or ends is known lost at once.
type PodSandbox struct {
	uri, namespace, image string
	memory, cpu           resource.Quantity // cpu zero: no limit
	user                  *int64
	nodeSelector          map[string]string
	pull                  corev1.PullPolicy
	start                 time.Duration
	engine                string
	cfg                   *rest.Config
	core                  *rest.RESTClient
	params                runtime.ParameterCodec
	orphan                []string

	stop     context.CancelFunc
	watching chan struct{} // closed when the watch has ended
	bg       sync.WaitGroup

	mu     sync.Mutex
	boxes  map[string]*podBox // by pod name
	closed bool
}

// podBox is one kernel's own pod: a k8s host that can be disposed of and
// can tell why its kernel died.
type podBox struct {
	*K8s
	sandbox *PodSandbox
	changed chan struct{} // a new sight of the pod (buffered 1)

	mu   sync.Mutex
	last *corev1.Pod
	why  string // why it is gone or going; "" while it may run
}

// parsePodImageURI reads k8s-image://IMAGE?namespace=N[&context=C&memory=
// 512Mi&cpu=1&user=UID&node_selector=K=V,…&pull=IfNotPresent].
func parsePodImageURI(uri string) (b *PodSandbox, kubeContext string, err error) {
	usage := "want k8s-image://IMAGE[?namespace=NS&context=CTX&memory=512Mi&cpu=1&user=UID&node_selector=KEY=VALUE,…&pull=IfNotPresent]"
	rest, ok := strings.CutPrefix(uri, "k8s-image://")
	if !ok {
		return nil, "", fmt.Errorf("backend %q: %s", uri, usage)
	}
	ref, query, _ := strings.Cut(rest, "?")
	if !imageRef.MatchString(ref) {
		return nil, "", fmt.Errorf("backend %q: %q is not an image reference (%s)", uri, ref, usage)
	}
	b = &PodSandbox{uri: uri, image: ref, memory: resource.MustParse(DefaultPodMemory), pull: corev1.PullIfNotPresent, start: DefaultPodStart}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, "", fmt.Errorf("backend %q: %v (%s)", uri, err, usage)
	}
	bad := func(format string, a ...any) (*PodSandbox, string, error) {
		return nil, "", fmt.Errorf("backend %q: "+format, append([]any{uri}, a...)...)
	}
	for k, v := range q {
		if len(v) != 1 {
			return bad("%s is given %d times", k, len(v))
		}
		val := v[0]
		switch k {
		case "namespace":
			if errs := validation.IsDNS1123Label(val); len(errs) > 0 {
				return bad("namespace %q is not a namespace name: %s", val, errs[0])
			}
			b.namespace = val
		case "context":
			if val == "" {
				return bad("context must name a context of the kubeconfig")
			}
			kubeContext = val
		case "memory":
			m, err := resource.ParseQuantity(val)
			if err != nil || m.Cmp(resource.MustParse("16Mi")) < 0 {
				return bad("memory must be a Kubernetes quantity of at least 16Mi such as 256Mi or 1Gi, got %q", val)
			}
			b.memory = m
		case "cpu":
			c, err := resource.ParseQuantity(val)
			if err != nil || c.Sign() <= 0 {
				return bad("cpu must be a Kubernetes quantity such as 500m or 2, got %q", val)
			}
			b.cpu = c
		case "user":
			uid, err := strconv.ParseInt(val, 10, 64)
			if err != nil || uid <= 0 || uid > 1<<31-1 {
				return bad("user must be a numeric uid other than 0 (pods run as non-root by uid), got %q", val)
			}
			b.user = &uid
		case "node_selector":
			b.nodeSelector = map[string]string{}
			for _, pair := range strings.Split(val, ",") {
				key, value, ok := strings.Cut(pair, "=")
				if !ok || len(validation.IsQualifiedName(key)) > 0 || len(validation.IsValidLabelValue(value)) > 0 {
					return bad("node_selector must be KEY=VALUE pairs of node labels, separated by commas, got %q", pair)
				}
				b.nodeSelector[key] = value
			}
		case "pull":
			p := corev1.PullPolicy(val)
			if p != corev1.PullAlways && p != corev1.PullIfNotPresent && p != corev1.PullNever {
				return bad("pull must be Always, IfNotPresent or Never, got %q", val)
			}
			b.pull = p
		case "pids":
			return bad("pids is not taken: Kubernetes bounds processes per node (the kubelet's podPidsLimit), not per pod")
		default:
			return bad("unknown option %q; %s", k, usage)
		}
	}
	return b, kubeContext, nil
}

// NewPodSandbox opens k8s-image://IMAGE?…: it reaches the API, deletes the
// pods an engine of this host that is gone left in the namespace, and
// starts the watch on the pods it makes.
func NewPodSandbox(uri string, opts Options) (*PodSandbox, error) {
	quietClientGo()
	b, kubeContext, err := parsePodImageURI(uri)
	if err != nil {
		return nil, err
	}
	var namespace string
	if b.cfg, namespace, err = k8sConfig(kubeContext); err != nil {
		return nil, fmt.Errorf("k8s-image %s: %w", uri, err)
	}
	b.namespace = cmp.Or(b.namespace, namespace, "default")
	if opts.k8sTransport != nil {
		b.cfg.WrapTransport = opts.k8sTransport
	}
	if b.core, b.params, err = coreClient(b.cfg); err != nil {
		return nil, fmt.Errorf("k8s-image %s: %w", uri, err)
	}
	b.engine, b.boxes, b.watching = engineLabel(), map[string]*podBox{}, make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(opts.K8sTimeout, DefaultK8sTimeout))
	defer cancel()
	rv, err := b.sweep(ctx)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	b.stop = stop
	go b.watchPods(wctx, rv)
	return b, nil
}

// apiHint says what to do about an API error.
func apiHint(err error, namespace string) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "; the API did not answer in time: check the kubeconfig's server and that the cluster is reachable"
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("; the engine's account needs get, list, watch, create and delete on pods and create on pods/exec in namespace %s", namespace)
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("; is there a namespace %s? (kubectl get namespaces)", namespace)
	}
	return ""
}

// sweep deletes the pods of engines on this host that are gone, and
// returns the list's resource version (where the watch starts).
func (b *PodSandbox) sweep(ctx context.Context) (string, error) {
	list := &corev1.PodList{}
	err := b.core.Get().Namespace(b.namespace).Resource("pods").
		VersionedParams(&metav1.ListOptions{LabelSelector: LabelManaged + "=1"}, b.params).Do(ctx).Into(list)
	if err != nil {
		return "", fmt.Errorf("k8s-image %s: list pods in namespace %s: %w%s", b.uri, b.namespace, err, apiHint(err, b.namespace))
	}
	for _, p := range list.Items {
		if !engineGone(p.Annotations[LabelEngine]) {
			continue
		}
		if err := b.delete(ctx, p.Name); err != nil {
			return "", fmt.Errorf("k8s-image %s: delete the pod %s left by a gone engine: %w", b.uri, p.Name, err)
		}
		b.orphan = append(b.orphan, fmt.Sprintf("pod %s/%s (kernel %s)", b.namespace, p.Name, p.Annotations[LabelKey]))
	}
	return list.ResourceVersion, nil
}

// delete deletes a pod at once (its processes are the kernel's alone).
func (b *PodSandbox) delete(ctx context.Context, name string) error {
	err := b.core.Delete().Namespace(b.namespace).Resource("pods").Name(name).
		Body(&metav1.DeleteOptions{GracePeriodSeconds: new(int64)}).Do(ctx).Error()
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// watchPods follows this backend's pods until stopped: every sight of one
// goes to its box. A watch that ends (the API's timeout, a version too
// old) is made again after a fresh list.
func (b *PodSandbox) watchPods(ctx context.Context, rv string) {
	defer close(b.watching)
	for ctx.Err() == nil {
		if rv == "" {
			list := &corev1.PodList{}
			err := b.core.Get().Namespace(b.namespace).Resource("pods").
				VersionedParams(&metav1.ListOptions{LabelSelector: LabelManaged + "=1"}, b.params).Do(ctx).Into(list)
			if err != nil {
				sleepCtx(ctx, time.Second)
				continue
			}
			seen := map[string]bool{}
			for i := range list.Items {
				seen[list.Items[i].Name] = true
				b.podSeen(&list.Items[i], false)
			}
			b.mu.Lock()
			var missing []*podBox
			for name, box := range b.boxes {
				if !seen[name] {
					missing = append(missing, box)
				}
			}
			b.mu.Unlock()
			for _, box := range missing {
				box.seen(nil, true)
			}
			rv = list.ResourceVersion
		}
		w, err := b.core.Get().Namespace(b.namespace).Resource("pods").
			VersionedParams(&metav1.ListOptions{LabelSelector: LabelManaged + "=1", Watch: true, ResourceVersion: rv, AllowWatchBookmarks: true}, b.params).Watch(ctx)
		if err != nil {
			rv = ""
			sleepCtx(ctx, time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok { // an error: relist
				rv = ""
				break
			}
			rv = p.ResourceVersion
			if ev.Type != watch.Bookmark {
				b.podSeen(p, ev.Type == watch.Deleted)
			}
		}
		w.Stop()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (b *PodSandbox) podSeen(p *corev1.Pod, deleted bool) {
	b.mu.Lock()
	box := b.boxes[p.Name]
	b.mu.Unlock()
	if box != nil {
		box.seen(p, deleted)
	}
}

// seen takes a new sight of the pod (nil: not found). The moment it is
// gone or going, its streams close: the engine collects the cell in flight
// over Execute, which fails at once with ErrHostGone.
func (d *podBox) seen(p *corev1.Pod, deleted bool) {
	d.mu.Lock()
	if p != nil {
		d.last = p
	}
	first := false
	if d.why == "" {
		var err error
		if deleted || p == nil {
			err = apierrors.NewNotFound(corev1.Resource("pods"), d.pod)
		}
		d.why = podGone(p, err, podContainer)
		first = d.why != ""
	}
	d.mu.Unlock()
	select {
	case d.changed <- struct{}{}:
	default:
	}
	if first {
		d.sandbox.bg.Go(func() { d.K8s.Close() })
	}
}

// goneWhy is the box's K8s.gone.
func (d *podBox) goneWhy() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.why
}

// podName is a pod's name for a kernel key: its owner and task, and a
// random suffix.
func podName(key string) string {
	who, _, _ := strings.Cut(key, "@")
	var sb strings.Builder
	for _, r := range strings.ToLower(who) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			sb.WriteRune(r)
		} else if s := sb.String(); s != "" && !strings.HasSuffix(s, "-") {
			sb.WriteByte('-')
		}
	}
	name := strings.TrimSuffix(sb.String(), "-")
	if len(name) > 40 {
		name = strings.TrimSuffix(name[:40], "-")
	}
	suffix := make([]byte, 3)
	rand.Read(suffix)
	if name == "" {
		return "kd-" + hex.EncodeToString(suffix)
	}
	return "kd-" + name + "-" + hex.EncodeToString(suffix)
}

// podSpec is a kernel's pod.
func (b *PodSandbox) podSpec(name, key string) *corev1.Pod {
	no, yes := false, true
	limits := corev1.ResourceList{corev1.ResourceMemory: b.memory}
	if !b.cpu.IsZero() {
		limits[corev1.ResourceCPU] = b.cpu
	}
	tmp := resource.MustParse(podTmpSize)
	sec := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	if b.user != nil {
		sec.RunAsUser, sec.RunAsGroup, sec.RunAsNonRoot = b.user, b.user, &yes
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.namespace,
			Labels: map[string]string{LabelManaged: "1"},
			// Label values cannot hold a key or the engine's identity.
			Annotations: map[string]string{LabelKey: key, LabelEngine: b.engine}},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			NodeSelector:                  b.nodeSelector,
			SecurityContext:               sec,
			Containers: []corev1.Container{{
				Name: podContainer, Image: b.image, ImagePullPolicy: b.pull,
				Command:   []string{"sleep", "infinity"},
				Resources: corev1.ResourceRequirements{Limits: limits},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no, Privileged: &no, ReadOnlyRootFilesystem: &yes,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
			}},
			Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &tmp}}}},
		},
	}
}

// Provision implements Provisioner: a new pod for the kernel key, waited
// for until its container runs. A pod that cannot start fails at once with
// its own reason, and is deleted.
func (b *PodSandbox) Provision(ctx context.Context, key string) (Env, error) {
	name := podName(key)
	d := &podBox{sandbox: b, changed: make(chan struct{}, 1)}
	d.K8s = &K8s{uri: b.uri + "#" + name, namespace: b.namespace, pod: name, container: podContainer, tempDir: "/tmp",
		cfg: b.cfg, core: b.core, params: b.params, gone: d.goneWhy, relays: map[*k8sRelay]struct{}{}}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("k8s-image %s: closed", b.uri)
	}
	b.boxes[name] = d // before the create: the watch may see it first
	b.mu.Unlock()
	fail := func(err error) (Env, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultK8sTimeout)
		defer cancel()
		b.delete(ctx, name)
		b.forget(d)
		return nil, err
	}
	created := &corev1.Pod{}
	err := b.core.Post().Namespace(b.namespace).Resource("pods").Body(b.podSpec(name, key)).Do(ctx).Into(created)
	if err != nil {
		// A create given up (the engine closing, a timeout) may have made
		// the pod all the same: its name is this call's alone. (A refill's
		// spare pod outlived every engine so.)
		return fail(fmt.Errorf("k8s-image %s: create pod %s/%s for %s: %w%s", b.uri, b.namespace, name, key, err, apiHint(err, b.namespace)))
	}
	d.seen(created, false)
	if err := d.waitRunning(ctx); err != nil {
		return fail(err)
	}
	return d, nil
}

func (b *PodSandbox) forget(d *podBox) {
	b.mu.Lock()
	delete(b.boxes, d.pod)
	b.mu.Unlock()
}

// waitRunning waits until the pod's container runs, following the watch
// (and asking the API after a quiet second, should a sight be missed).
func (d *podBox) waitRunning(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.sandbox.start)
	defer cancel()
	quiet := time.NewTicker(time.Second)
	defer quiet.Stop()
	var unschedulable time.Time
	for {
		d.mu.Lock()
		p, why := d.last, d.why
		d.mu.Unlock()
		if why != "" {
			return fmt.Errorf("k8s-image %s: pod %s/%s %s before its kernel started%s", d.sandbox.uri, d.namespace, d.pod, why, podWhere(p))
		}
		if p != nil {
			for _, cs := range p.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil && fatalWaiting[w.Reason] != "" {
					return fmt.Errorf("k8s-image %s: pod %s/%s cannot start: %s: %s%s; %s", d.sandbox.uri, d.namespace, d.pod,
						w.Reason, strings.TrimSpace(w.Message), podWhere(p), fatalWaiting[w.Reason])
				}
				if cs.Name == podContainer && cs.State.Running != nil && p.Status.Phase == corev1.PodRunning {
					return nil
				}
			}
			for _, c := range p.Status.Conditions {
				if c.Type != corev1.PodScheduled || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable {
					continue
				}
				if unschedulable.IsZero() {
					unschedulable = time.Now()
				} else if time.Since(unschedulable) > unschedulableWait {
					return fmt.Errorf("k8s-image %s: pod %s/%s cannot be scheduled: %s (image %s); free room on the nodes, or ask for less memory= and cpu=, or another node_selector=",
						d.sandbox.uri, d.namespace, d.pod, c.Message, d.sandbox.image)
				}
			}
		}
		select {
		case <-d.changed:
		case <-quiet.C:
			gctx, gcancel := context.WithTimeout(ctx, DefaultK8sTimeout)
			got := &corev1.Pod{}
			err := d.core.Get().Namespace(d.namespace).Resource("pods").Name(d.pod).Do(gctx).Into(got)
			gcancel()
			switch {
			case err == nil:
				d.seen(got, false)
			case apierrors.IsNotFound(err):
				d.seen(nil, true)
			}
		case <-ctx.Done():
			return fmt.Errorf("k8s-image %s: pod %s/%s did not start within %v%s%s: %w", d.sandbox.uri, d.namespace, d.pod,
				d.sandbox.start, podWhere(p), d.events(), ctx.Err())
		}
	}
}

// podWhere says where a pod is in its life: phase, node, image.
func podWhere(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf(" (phase %s, node %s, image %s)", cmp.Or(string(p.Status.Phase), "unknown"), cmp.Or(p.Spec.NodeName, "none yet"), p.Spec.Containers[0].Image)
}

// events are the pod's warning events, for an error.
func (d *podBox) events() string {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultK8sTimeout)
	defer cancel()
	list := &corev1.EventList{}
	sel := fields.SelectorFromSet(fields.Set{"involvedObject.name": d.pod, "type": corev1.EventTypeWarning}).String()
	if err := d.core.Get().Namespace(d.namespace).Resource("events").
		VersionedParams(&metav1.ListOptions{FieldSelector: sel}, d.params).Do(ctx).Into(list); err != nil || len(list.Items) == 0 {
		return ""
	}
	var msgs []string
	for _, e := range list.Items {
		msgs = append(msgs, e.Reason+": "+e.Message)
	}
	return "; its events: " + strings.Join(slices.Compact(msgs), "; ")
}

// URI implements Env.
func (b *PodSandbox) URI() string { return b.uri }

// TempDir implements Env: every kernel's pod has its emptyDir here.
func (b *PodSandbox) TempDir() string { return "/tmp" }

// Execute implements Env; commands run in kernels' pods (Provision).
func (b *PodSandbox) Execute(context.Context, string, ExecOptions) (Result, error) {
	return Result{}, fmt.Errorf("k8s-image %s: %w", b.uri, errNoHost)
}

// OrphansRemoved implements OrphanReporter.
func (b *PodSandbox) OrphansRemoved() []string { return b.orphan }

// Pods are the names of the kernels' pods now (for tests that check
// nothing is left).
func (b *PodSandbox) Pods() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	for name := range b.boxes {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Close deletes the pods still there and stops the watch.
func (b *PodSandbox) Close() error {
	b.mu.Lock()
	b.closed = true
	boxes := make([]*podBox, 0, len(b.boxes))
	for _, d := range b.boxes {
		boxes = append(boxes, d)
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, d := range boxes {
		errs = append(errs, d.Dispose(ctx))
	}
	b.stop()
	<-b.watching
	b.bg.Wait()
	return errors.Join(errs...)
}

// Dispose implements Disposer for a kernel's own pod: its streams close and
// it is deleted, with everything running in it, and waited for until the
// API no longer lists it.
func (d *podBox) Dispose(ctx context.Context) error {
	d.K8s.Close()
	b := d.sandbox
	err := b.delete(ctx, d.pod)
	for err == nil {
		p := &corev1.Pod{}
		gerr := d.core.Get().Namespace(d.namespace).Resource("pods").Name(d.pod).Do(ctx).Into(p)
		if apierrors.IsNotFound(gerr) {
			break
		}
		if ctx.Err() != nil {
			err = ctx.Err()
			break
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	b.forget(d)
	if err != nil {
		return fmt.Errorf("k8s-image %s: delete pod %s/%s: %w", b.uri, d.namespace, d.pod, err)
	}
	return nil
}

// DeathCause implements DeathExplainer for a kernel's own pod: out of
// memory (the container's OOMKilled state, or the cgroup's count of kills:
// the runner is not the container's first process), a deletion, an
// eviction, the container's end.
func (d *podBox) DeathCause(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultK8sTimeout)
	defer cancel()
	oom := fmt.Sprintf("out of memory: killed for exceeding its pod's memory limit of %s", d.sandbox.memory.String())
	p := &corev1.Pod{}
	err := d.core.Get().Namespace(d.namespace).Resource("pods").Name(d.pod).Do(ctx).Into(p)
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; err == nil && t != nil && t.Reason == "OOMKilled" {
			return oom
		}
	}
	if why := podGone(p, err, podContainer); why != "" {
		return "its pod " + d.namespace + "/" + d.pod + " " + why
	}
	if err == nil && cgroupOOMKilled(ctx, d.K8s) {
		return oom
	}
	return ""
}

// Place implements Placement: the pod and its node.
func (d *podBox) Place() Place {
	d.mu.Lock()
	defer d.mu.Unlock()
	pl := Place{Kind: "pod", Name: d.namespace + "/" + d.pod}
	if d.last != nil {
		pl.Node = d.last.Spec.NodeName
	}
	return pl
}

// cgroupOOMKilled reports whether the OOM killer killed a process in the
// host's memory cgroup (v2 memory.events, v1 memory.oom_control): Docker
// and the kubelet mark a container OOMKilled only when its first process
// is the one killed. The host is the kernel's alone.
func cgroupOOMKilled(ctx context.Context, env Env) bool {
	res, err := env.Execute(ctx, `cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null`, ExecOptions{Timeout: DefaultDockerTimeout})
	if err != nil {
		return false
	}
	for _, line := range strings.Split(res.Output, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" && f[1] != "0" {
			return true
		}
	}
	return false
}
