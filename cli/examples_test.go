package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/replay"
)

// evictionBusyOwner is the owner whose 20 s cell in examples/eviction.jsonl
// keeps its kernel busy while the others are evicted.
const evictionBusyOwner = "alice"

// exampleAnswer is an answer of kerneldeck headless: a result, an ok or an
// error.
type exampleAnswer struct {
	ID     string `json:"id"`
	Op     string `json:"op"`
	Status string `json:"status"`
	Error  string `json:"error"`
	Kernel *struct {
		ID        string `json:"id"`
		StateLost bool   `json:"state_lost"`
	} `json:"kernel"`
}

// exampleEvent is an event line of kerneldeck headless --events.
type exampleEvent struct {
	Type   string `json:"type"`
	Kernel string `json:"kernel"`
	Owner  string `json:"owner"`
	Detail string `json:"detail"`
}

// TestEvictionExample runs examples/eviction.jsonl through the real headless
// mode with the cap it is meant for and checks the story it tells: kernels
// are evicted by the cap, never while a cell runs, and never the busy one.
func TestEvictionExample(t *testing.T) {
	path := filepath.Join("..", "examples", "eviction.jsonl")
	in, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kernels := isolate(t)
	// Fed as the dashboard's --replay feeds it: at its own pace, without
	// the replay's own fields.
	feed, err := replay.Load(bytes.NewReader(in), 1, false)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(feed.Run(context.Background(), pw)) }()
	start := time.Now()
	var out, errb bytes.Buffer
	code := Run([]string{"headless", "--events", "--max-kernels", "3"}, pr, &out, &errb)
	stdout, stderr := out.String(), errb.String()
	elapsed := time.Since(start)
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if elapsed > 60*time.Second {
		t.Errorf("the example took %v; it should end soon after its 20 s cell", elapsed.Round(time.Second))
	}
	answers, events := parseExampleOutput(t, stdout)

	// Every request got its answer: a successful result or an ok.
	var busyKernel string
	for _, req := range exampleRequests(t, in) {
		a, ok := answers[req.id]
		switch {
		case !ok:
			t.Errorf("request %q got no answer", req.id)
		case req.op == "execute" && (a.Op != "result" || a.Status != "success" || a.Kernel == nil || a.Kernel.StateLost):
			t.Errorf("request %q: %+v, want a success in a kernel that kept its state", req.id, a)
		case req.op != "execute" && a.Op != "ok":
			t.Errorf("request %q: %+v, want ok", req.id, a)
		}
		if req.owner == evictionBusyOwner && ok && a.Kernel != nil {
			busyKernel = a.Kernel.ID
		}
	}
	if busyKernel == "" {
		t.Fatalf("no result for the busy owner %q", evictionBusyOwner)
	}

	// Evictions happen, never to the busy kernel, never to a kernel
	// with a running cell.
	running := map[string]int{} // kernel -> cells started but not finished
	evicted, skipped := 0, false
	for _, ev := range events {
		switch ev.Type {
		case "cell_started":
			running[ev.Kernel]++
		case "cell_finished":
			running[ev.Kernel]--
		case "evict_skipped_busy":
			skipped = skipped || strings.Contains(ev.Detail, busyKernel)
		case "evicted_cap":
			evicted++
			if ev.Kernel == busyKernel || ev.Owner == evictionBusyOwner {
				t.Errorf("the busy owner's kernel was evicted: %+v", ev)
			}
			if running[ev.Kernel] != 0 {
				t.Errorf("kernel %s evicted with a cell running: %+v", ev.Kernel, ev)
			}
		}
	}
	if evicted < 2 {
		t.Errorf("%d evicted_cap events, want at least 2; events:\n%s", evicted, stdout)
	}
	if !skipped {
		t.Errorf("no evict_skipped_busy event naming the busy kernel %s; events:\n%s", busyKernel, stdout)
	}
	wantNoProcessesUnder(t, kernels)
}

type exampleRequest struct{ id, op, owner string }

// exampleRequests parses the requests of an example file.
func exampleRequests(t *testing.T, in []byte) []exampleRequest {
	t.Helper()
	var reqs []exampleRequest
	for sc := bufio.NewScanner(bytes.NewReader(in)); sc.Scan(); {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) == 0 || line[0] == '#' {
			continue
		}
		var r struct{ ID, Op, Owner string }
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("example line %q: %v", sc.Text(), err)
		}
		reqs = append(reqs, exampleRequest{r.ID, r.Op, r.Owner})
	}
	return reqs
}

// parseExampleOutput splits headless output into answers by id and events
// in order.
func parseExampleOutput(t *testing.T, stdout string) (answers map[string]exampleAnswer, events []exampleEvent) {
	t.Helper()
	answers = map[string]exampleAnswer{}
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var op struct{ Op string }
		if err := json.Unmarshal([]byte(l), &op); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		if op.Op == "event" {
			var ev exampleEvent
			if err := json.Unmarshal([]byte(l), &ev); err != nil {
				t.Fatalf("event line %q: %v", l, err)
			}
			events = append(events, ev)
			continue
		}
		var a exampleAnswer
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatalf("answer line %q: %v", l, err)
		}
		if _, dup := answers[a.ID]; dup {
			t.Errorf("two answers for request %q", a.ID)
		}
		answers[a.ID] = a
	}
	return answers, events
}

// TestKernelImageExample: examples/kernel-image.sh builds, with no
// registry, an image a docker-image:// kernel runs in, as root and as the
// image's unprivileged user.
func TestKernelImageExample(t *testing.T) {
	dc := dockertest.Client(t)
	tag := fmt.Sprintf("kerneldeck-example-test:%d", os.Getpid())
	build := exec.Command("bash", filepath.Join("..", "examples", "kernel-image.sh"), tag)
	out, err := build.CombinedOutput()
	t.Cleanup(func() { dc.ImageRemove(context.Background(), tag, client.ImageRemoveOptions{Force: true}) })
	if err != nil || !strings.Contains(string(out), "built "+tag) {
		t.Fatalf("kernel-image.sh: %v\n%s", err, out)
	}
	isolate(t)
	for _, c := range []struct{ query, uid string }{{"", "0"}, {"?user=kernel", "1000"}} {
		code, stdout, stderr := runCLI(t, `{"id":"1","op":"execute","code":"import os, ssl, sqlite3; print('uid', os.getuid())"}`+"\n",
			"headless", "--backend", "docker-image://"+tag+c.query)
		if code != 0 || !strings.Contains(stdout, `"stdout":"uid `+c.uid+`\n"`) {
			t.Errorf("a cell in docker-image://%s%s: exit %d, %s %s", tag, c.query, code, stdout, stderr)
		}
	}
}
