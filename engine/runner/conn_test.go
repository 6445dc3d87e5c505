package runner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

// dialAuthed connects to the runner in kd as the engine does and answers
// its challenge with secret.
func dialAuthed(t *testing.T, kd, secret string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("unix", filepath.Join(kd, "sock"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	br := bufio.NewReader(c)
	var hello struct{ Op, Nonce string }
	line, err := br.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &hello) != nil || hello.Op != "hello" {
		t.Fatalf("no challenge (%q): %v", line, err)
	}
	auth, _ := json.Marshal(map[string]string{"op": "auth", "mac": kernelauth.MAC(secret, kernelauth.Engine, hello.Nonce), "nonce": kernelauth.NewNonce()})
	if _, err := c.Write(append(auth, '\n')); err != nil {
		t.Fatal(err)
	}
	if line, err = br.ReadBytes('\n'); err != nil || !strings.Contains(string(line), `"auth_ok"`) {
		t.Fatalf("refused (%q): %v", line, err)
	}
	return c, br
}

// engineSide is a test's authenticated connection to a fresh runner, as
// the engine holds it.
type engineSide struct {
	t      *testing.T
	c      net.Conn
	br     *bufio.Reader
	kd     string // the kernel dir
	secret string
}

// startEngineSide starts a runner from source and connects to it.
func startEngineSide(t *testing.T) *engineSide {
	t.Helper()
	secret := strings.Repeat("ab", 32)
	line, _, kd := startShipped(t, shipment{script: Source}, `{"secret": "`+secret+`", "idle_exit": 60}`+"\n")
	if !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready pipe: %q, want READY ...", line)
	}
	c, br := dialAuthed(t, kd, secret)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &engineSide{t: t, c: c, br: br, kd: kd, secret: secret}
}

// frame is v as one line.
func frame(v any) []byte {
	b, _ := json.Marshal(v)
	return append(b, '\n')
}

// cellFrame is a cell as the engine sends it, without streaming.
func cellFrame(id, code string) []byte {
	return frame(map[string]any{"op": "cell", "id": id, "code": code, "stream": false, "timeout": 30})
}

// write sends b and gives the runner time to read it on its own.
func (e *engineSide) write(b []byte) {
	e.t.Helper()
	if _, err := e.c.Write(b); err != nil {
		e.t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
}

// runOnes runs n cells of 1 back to back, without write's pause, each
// checked to show 1.
func (e *engineSide) runOnes(n int) {
	e.t.Helper()
	for i := range n {
		if _, err := e.c.Write(cellFrame("n"+strconv.Itoa(i), "1")); err != nil {
			e.t.Fatal(err)
		}
		if f, _ := e.result(); f.Status != "ok" || f.Stdout != "1\n" {
			e.t.Fatalf("cell %d: %s %q %s", i, f.Status, f.Stdout, f.Traceback)
		}
	}
}

// resultFrame is what the tests read of a cell's result.
type resultFrame struct {
	Op, ID, Status, Stdout, Stderr, Traceback string
	StdoutClipped                             bool `json:"stdout_clipped"`
}

// result reads frames up to the next result, and returns it with what was
// streamed for its cell before it ("stream:text" each).
func (e *engineSide) result() (resultFrame, string) {
	e.t.Helper()
	var streamed strings.Builder
	for {
		l, err := e.br.ReadBytes('\n')
		if err != nil {
			e.t.Fatalf("waiting for a result: %v", err)
		}
		var f struct {
			resultFrame
			Stream, Text string
		}
		if err := json.Unmarshal(l, &f); err != nil {
			e.t.Fatalf("frame %.200q: %v", l, err)
		}
		switch f.Op {
		case "output":
			streamed.WriteString(f.Stream + ":" + f.Text)
		case "result":
			return f.resultFrame, streamed.String()
		}
	}
}

// The runner reads its engine connection in chunks of RECV_FIRST, then
// RECV_CHUNK once a read filled the first (this frame is longer than both): a frame
// is run whole however the writes cut it (a line longer than a chunk, a
// newline alone, the end of one frame and the start of the next in one
// write), and several frames in one read are each run, in order.
func TestRunnerReadsFramesHoweverTheyArrive(t *testing.T) {
	e := startEngineSide(t)
	result := func(id, stdout string) {
		t.Helper()
		f, _ := e.result()
		if f.ID != id || f.Status != "ok" || f.Stdout != stdout {
			t.Fatalf("result of cell %s: %s, stdout %q, traceback %q; want cell %s ok, %q", f.ID, f.Status, f.Stdout, f.Traceback, id, stdout)
		}
	}

	long := strings.Repeat("x", 300<<10)
	big := cellFrame("big", "s = '"+long+"'\nprint(len(s))")
	for i := 0; i < len(big)-1; i += 16 << 10 {
		e.write(big[i:min(i+16<<10, len(big)-1)])
	}
	e.write([]byte("\n"))
	result("big", strconv.Itoa(len(long))+"\n")

	small, next := cellFrame("small", "print(len(s) + 1)"), cellFrame("next", "print(len(s) + 2)")
	e.write(small[:10])
	e.write(append(small[10:], next[:10]...))
	result("small", strconv.Itoa(len(long)+1)+"\n")
	e.write(next[10:])
	result("next", strconv.Itoa(len(long)+2)+"\n")

	e.write(append(cellFrame("a", "n = 40"), cellFrame("b", "print(n + 2)")...))
	result("a", "")
	result("b", "42\n")
}

// Until a peer has answered the challenge, the runner keeps at most a few
// KiB of what it sends: an endless line, a frame that is not JSON or a wrong
// answer ends the connection (before, an endless line grew the runner's
// memory without bound), and the engine's own connection goes on.
func TestRunnerRefusesWhatComesBeforeTheChallengeIsAnswered(t *testing.T) {
	e := startEngineSide(t)
	wrongMAC := frame(map[string]string{"op": "auth", "mac": strings.Repeat("0", 64), "nonce": kernelauth.NewNonce()})
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"an endless line", bytes.Repeat([]byte("x"), 4<<20)},
		{"a frame that is not JSON", []byte("not json\n")},
		{"a wrong answer", wrongMAC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.DialTimeout("unix", filepath.Join(e.kd, "sock"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			if line, err := br.ReadBytes('\n'); err != nil || !strings.Contains(string(line), `"hello"`) {
				t.Fatalf("no challenge (%q): %v", line, err)
			}
			// The runner may close while this is still being written.
			for i := 0; i < len(tc.send); i += 64 << 10 {
				if _, err := c.Write(tc.send[i:min(i+64<<10, len(tc.send))]); err != nil {
					break
				}
			}
			line, err := br.ReadBytes('\n')
			if len(line) > 0 || err == nil {
				t.Fatalf("the runner answered %q", line)
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the connection is still open 20 s after %d bytes were sent without answering the challenge", len(tc.send))
			}
		})
	}
	e.write(cellFrame("after", "print('still here')"))
	if f, _ := e.result(); f.ID != "after" || f.Stdout != "still here\n" {
		t.Fatalf("the engine's connection after the refusals: cell %s %s, stdout %q", f.ID, f.Status, f.Stdout)
	}
}

// A watch can reach the runner before the cell it names (the engine sends
// it when an output subscriber comes while the cell is starting): that
// cell then streams its output to the socket; a cell the watch does not
// name does not, and the next cell ends the watch either way.
func TestRunnerWatchBeforeItsCellStreamsIt(t *testing.T) {
	e := startEngineSide(t)
	for _, tc := range []struct{ watch, cell, want string }{
		{"w1", "w1", "stdout:hi\n"},
		{"w3", "w2", ""},
		{"", "w3", ""}, // a watch is kept for the next cell only
	} {
		if tc.watch != "" {
			e.write(frame(map[string]string{"op": "watch", "id": tc.watch})) // read on its own, before the cell
		}
		e.write(cellFrame(tc.cell, "print('hi')"))
		f, streamed := e.result()
		if f.ID != tc.cell || f.Status != "ok" {
			t.Fatalf("result of cell %s: %s; want cell %s ok", f.ID, f.Status, tc.cell)
		}
		if streamed != tc.want {
			t.Errorf("watch %q, cell %s streamed %q, want %q", tc.watch, tc.cell, streamed, tc.want)
		}
	}
}

// streamCellFrame is a cell as the engine sends it for a caller that wants
// its output as it comes.
func streamCellFrame(id, code string) []byte {
	return frame(map[string]any{"op": "cell", "id": id, "code": code, "stream": true, "timeout": 30})
}

// A streamed cell's output frames carry only what that cell wrote: the io
// thread, still reading the doors when the next cell starts, must not send
// the end of the previous cell's output under the new cell's id (the REPL
// then printed a line twice). Each cell outlasts IO_DELAY, so the io thread
// streams it, and prints last, so its output is still in the file when the
// next one begins. (The window is a few microseconds wide: with a 1 ms
// sleep put into it, the runner before the fix failed this test within 20
// cells.)
func TestRunnerStreamsOnlyTheCellsOwnOutput(t *testing.T) {
	e := startEngineSide(t)
	e.c.SetDeadline(time.Now().Add(5 * time.Minute))
	for i := range 300 {
		id := "c" + strconv.Itoa(i)
		if _, err := e.c.Write(streamCellFrame(id, "import time\ntime.sleep(0.003)\nprint('"+id+"')")); err != nil {
			t.Fatal(err)
		}
		f, streamed := e.result()
		if f.ID != id || f.Status != "ok" || f.Stdout != id+"\n" {
			t.Fatalf("result of cell %s: %s, stdout %q, traceback %q; want cell %s ok", f.ID, f.Status, f.Stdout, f.Traceback, id)
		}
		if got := strings.ReplaceAll(streamed, "stdout:", ""); got != id+"\n" {
			t.Fatalf("cell %s streamed %q, want its own line only", id, streamed)
		}
	}
}

// A cell's source stays for as long as something may show it: always for a
// cell that defined code (a function's source, its traceback lines), and
// for the latest PLAIN_SOURCES_KEEP cells that defined none; the older
// ones are dropped, or a kernel's memory grew by ~300 bytes a cell.
func TestRunnerKeepsTheSourcesThatCanStillBeShown(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("def", "def f():\n    return 1 / 0\n"))
	if f, _ := e.result(); f.Status != "ok" {
		t.Fatalf("def: %s %s", f.Status, f.Traceback)
	}
	for i := range 300 {
		id := "plain" + strconv.Itoa(i)
		if _, err := e.c.Write(cellFrame(id, "x = "+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
		if f, _ := e.result(); f.ID != id || f.Status != "ok" {
			t.Fatalf("cell %s: %s %s", id, f.Status, f.Traceback)
		}
	}
	e.write(cellFrame("count", "import inspect, linecache\n"+
		"print(inspect.getsource(f).splitlines()[0], sum(1 for k in linecache.cache if k.startswith('<cell-')))"))
	f, _ := e.result()
	fields := strings.Fields(f.Stdout)
	if len(fields) < 2 {
		t.Fatalf("count: %s, stdout %q, traceback %q", f.Status, f.Stdout, f.Traceback)
	}
	kept, err := strconv.Atoi(fields[len(fields)-1])
	if f.Status != "ok" || fields[0] != "def" || err != nil {
		t.Fatalf("count: %s, stdout %q, traceback %q", f.Status, f.Stdout, f.Traceback)
	}
	if kept > 2*100+3 {
		t.Errorf("%d cell sources kept after 302 cells, 300 of them plain; want at most %d", kept, 2*100+3)
	}
	e.write(cellFrame("raise", "f()"))
	if f, _ := e.result(); f.Status != "error" || !strings.Contains(f.Traceback, "return 1 / 0") || !strings.Contains(f.Traceback, "ZeroDivisionError") {
		t.Errorf("a traceback through the first cell's function: %s %q; want its source line shown", f.Status, f.Traceback)
	}
}

// The ids kept for exactly-once are bounded (SEEN_KEEP to twice that, 256
// at least): a kernel no longer grows by an id a cell for ever, and a
// recent id still never runs twice.
func TestRunnerKeepsTheLatestCellIds(t *testing.T) {
	e := startEngineSide(t)
	e.c.SetDeadline(time.Now().Add(2 * time.Minute))
	const n = 2*256 + 100
	for i := range n {
		id := "s" + strconv.Itoa(i)
		if _, err := e.c.Write(cellFrame(id, "1")); err != nil {
			t.Fatal(err)
		}
		if f, _ := e.result(); f.ID != id || f.Status != "ok" {
			t.Fatalf("cell %s: %s %s", id, f.Status, f.Traceback)
		}
	}
	e.write(cellFrame("count", "import sys\nprint(len(sys.modules['__main__'].RUNNER.seen))"))
	f, _ := e.result()
	kept, err := strconv.Atoi(strings.TrimSpace(f.Stdout))
	if f.Status != "ok" || err != nil {
		t.Fatalf("count: %s, stdout %q, traceback %q", f.Status, f.Stdout, f.Traceback)
	}
	if kept > 2*256 || kept < 256 {
		t.Errorf("%d cell ids kept after %d cells; want 256 to 512", kept, n+1)
	}
	// An id of the latest cells is refused, not run again.
	e.write(cellFrame("s"+strconv.Itoa(n-50), "print('ran twice')"))
	l, err := e.br.ReadBytes('\n')
	if err != nil || !strings.Contains(string(l), `"op": "error"`) || !strings.Contains(string(l), "already ran") {
		t.Fatalf("a recent id sent again: %q %v; want an error that it already ran", l, err)
	}
}
