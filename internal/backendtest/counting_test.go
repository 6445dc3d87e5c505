package backendtest_test

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
)

func TestMarkerOf(t *testing.T) {
	for cmd, want := range map[string]string{
		"# kerneldeck:spawn\nset -u\n": "spawn",
		"# kerneldeck:cell\n":          "cell",
		"  # kerneldeck:fetch  \nhead": "fetch",
		"# kerneldeck:once":            "once",
		"echo hi":                      "",
		"":                             "",
		"echo x\n# kerneldeck:cell\n":  "",
		"# kerneldeck:\n":              "",
	} {
		if got := backendtest.MarkerOf(cmd); got != want {
			t.Errorf("MarkerOf(%q) = %q, want %q", cmd, got, want)
		}
	}
}

func TestCountingCountsExecutes(t *testing.T) {
	ctx := context.Background()
	c := backendtest.NewCounting(backends.ExecuteOnly(backends.NewLocal(t.TempDir())))
	if backends.StreamsOf(c) != nil {
		t.Fatal("Counting over ExecuteOnly must not offer streams")
	}
	if _, ok := c.(backends.StreamDialer); ok {
		t.Fatal("Counting over ExecuteOnly implements StreamDialer")
	}
	for _, cmd := range []string{"# kerneldeck:cell\necho 1", "# kerneldeck:cell\necho 2", "# kerneldeck:spawn\ntrue", "echo plain"} {
		res, err := c.Execute(ctx, cmd, backends.ExecOptions{Stdin: []byte("payload-not-recorded")})
		if err != nil || res.ReturnCode != 0 {
			t.Fatalf("%q: %v %+v", cmd, err, res)
		}
	}
	if got := c.Executes(); got != 4 {
		t.Errorf("Executes() = %d, want 4", got)
	}
	for m, want := range map[string]int{"cell": 2, "kerneldeck:cell": 2, "# kerneldeck:cell": 2, "spawn": 1, "": 1, "probe": 0} {
		if got := c.ByMarker(m); got != want {
			t.Errorf("ByMarker(%q) = %d, want %d", m, got, want)
		}
		if got := c.Returned(m); got != want {
			t.Errorf("Returned(%q) = %d, want %d", m, got, want)
		}
	}
	if got := fmt.Sprint(c.Markers()); got != "map[:1 cell:2 spawn:1]" {
		t.Errorf("Markers() = %s", got)
	}
	cmds := c.Commands()
	if len(cmds) != 4 || cmds[3] != "echo plain" || strings.Contains(strings.Join(cmds, ""), "payload") {
		t.Errorf("Commands() = %q", cmds)
	}
	if w, ok := c.(backends.Wrapper); !ok || w.Unwrap() == nil || w.Unwrap().URI() != "local" {
		t.Error("Counting does not unwrap to its inner Env")
	}
	c.Reset()
	if c.Executes() != 0 || c.ByMarker("cell") != 0 || len(c.Commands()) != 0 || len(c.Markers()) != 0 {
		t.Errorf("after Reset: %d executes, %v markers, %d commands", c.Executes(), c.Markers(), len(c.Commands()))
	}
}

func TestCountingCountsFrames(t *testing.T) {
	local := backends.NewLocal(t.TempDir())
	tr, err := backends.OpenTracer(t.TempDir() + "/trace")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	// Streams are found through wrappers (here a tracer) and counted.
	c := backendtest.NewCounting(backends.Traced(local, tr))
	d := backends.StreamsOf(c)
	if d == nil {
		t.Fatal("Counting over a local Env must offer streams")
	}
	if d != c.(backends.StreamDialer) {
		t.Fatal("StreamsOf(Counting) must find the Counting itself, or frames go uncounted")
	}

	// A python listener on a Unix socket that answers every line it reads.
	sock := t.TempDir() + "/s"
	py := exec.Command("python3", "-c", `import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); f = c.makefile("rwb")
for line in f:
    f.write(b"ok\n"); f.flush()
`, sock)
	stdout, _ := py.StdoutPipe()
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { py.Process.Kill(); py.Wait() }()
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("listener: %q", line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := d.DialUnix(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	// Two whole frames in one write, then one frame in three writes.
	writes := []string{`{"op":"cell","id":"a"}` + "\n" + `{"op":"ping"}` + "\n", `{"op":"ce`, `ll","id":"b"`, "}\n"}
	for _, w := range writes {
		if _, err := conn.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if c.Frames() != 3 || c.FramesByOp("cell") != 2 || c.FramesByOp("ping") != 1 || c.Dials() != 1 {
		t.Fatalf("Frames() = %d, cell %d, ping %d, dials %d; want 3, 2, 1, 1", c.Frames(), c.FramesByOp("cell"), c.FramesByOp("ping"), c.Dials())
	}
	if c.Executes() != 0 {
		t.Fatalf("Executes() = %d for stream traffic only", c.Executes())
	}
	c.Reset()
	if c.Frames() != 0 || c.FramesByOp("cell") != 0 || c.Dials() != 0 {
		t.Fatal("Reset did not zero the frame counters")
	}
}

// The Counting wrapper is itself a conforming Env, with and without streams.
func TestCountingContract(t *testing.T) {
	backendtest.Contract(t, func(t *testing.T) backends.Env {
		return backendtest.NewCounting(backends.NewLocal(t.TempDir()))
	})
}
