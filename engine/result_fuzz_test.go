package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

// What a runner sends back (cells/<id>.res printed as "KD:RESULT <json>" by
// the cell script, or JSON-line frames on its socket) is written by a
// process that runs arbitrary user code: hostile input. These targets feed
// arbitrary bytes to the engine's real paths (runnerConn.next, execDoor.run,
// streamDoor.run, finishCell, resultFromFrame) and check what the caller
// gets.

// FuzzRunnerConn writes arbitrary bytes into a runner connection while cell
// c1 runs: the reader never panics, returns exactly the complete lines that
// decode as frames of c1 (or tool requests), in order and intact, drops a
// last line without its newline, and closes the connection when the
// runner's side ends.
func FuzzRunnerConn(f *testing.F) {
	for _, s := range []string{
		`{"op":"result","id":"c1","status":"ok","stdout":"42\n","execution_count":1}` + "\n",
		`{"op":"output","id":"c1","stream":"stdout","text":"x"}` + "\n" + `{"op":"pong","pid":7}` + "\n",
		"not json\n{\"op\":\"error\",\"id\":\"c1\",\"error\":\"boom\"}\r\n",
		`{"op":"result","status":5}` + "\n" + `{"op":"rpc","name":"1.req","data":"{}"}` + "\n",
		`{"op":"result","id":"c1"}`, // no newline: never delivered
		"\n\n[]\nnull\n{}\n",
		`{"OP":"result","Id":"c1","op":"output"}` + "\n",
	} {
		f.Add([]byte(s), uint16(4096))
		f.Add([]byte(s), uint16(1))
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) {
		conn := &scriptedConn{r: bytes.NewReader(data), chunk: int(chunk)%(80<<10) + 1, gate: make(chan struct{})}
		rc := newConn(conn, bufio.NewReaderSize(conn, 64<<10), nil)
		defer rc.begin(context.Background(), time.Time{})() // as the engine does once it sent a cell
		close(conn.gate)
		var got []runnerFrame
		for {
			fr, err := rc.next("c1")
			if err != nil {
				break
			}
			got = append(got, fr)
		}
		if !rc.closed() || !conn.isClosed() {
			t.Fatal("the connection was not closed at the end of the stream")
		}
		var want []runnerFrame
		lines := bytes.SplitAfter(data, []byte("\n"))
		for _, l := range lines {
			if !bytes.HasSuffix(l, []byte("\n")) {
				continue // the last line, cut off: never a frame
			}
			if len(l)-1 > maxFrame {
				t.Fatalf("a fuzz input cannot hold a line over maxFrame")
			}
			var fr runnerFrame
			if json.Unmarshal(l, &fr) == nil && (fr.ID == "c1" || fr.Op == "rpc") {
				want = append(want, fr)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("input %q: %d frames delivered, want %d:\ngot  %+v\nwant %+v", data, len(got), len(want), got, want)
		}
		for i := range got {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Fatalf("input %q: frame %d is %+v, want %+v", data, i, got[i], want[i])
			}
		}
	})
}

// scriptedConn is a runner's side that sends fixed bytes, at most chunk per
// Read, once gate is closed, and then ends.
type scriptedConn struct {
	r      io.Reader
	chunk  int
	gate   chan struct{}
	mu     sync.Mutex
	closed bool
}

func (c *scriptedConn) Read(p []byte) (int, error) {
	<-c.gate
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return c.r.Read(p[:min(len(p), c.chunk)])
}

func (c *scriptedConn) Write(p []byte) (int, error) { return len(p), nil }

func (c *scriptedConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *scriptedConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *scriptedConn) LocalAddr() net.Addr              { return &net.UnixAddr{Name: "engine", Net: "unix"} }
func (c *scriptedConn) RemoteAddr() net.Addr             { return &net.UnixAddr{Name: "runner", Net: "unix"} }
func (c *scriptedConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptedConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptedConn) SetWriteDeadline(time.Time) error { return nil }

// A line longer than maxFrame closes the connection without being delivered,
// however close to the limit, and the engine's buffer stays bounded; a line
// of exactly maxFrame bytes still arrives. Not a fuzz target: a fuzzer never
// writes 8 MiB.
func TestRunnerConnFrameLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("streams more than 8 MiB")
	}
	frame := func(n int) []byte { // a valid frame line of n bytes before its newline
		head, tail := `{"op":"output","id":"c1","text":"`, `"}`
		return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail + "\n")
	}
	after := []byte(`{"op":"output","id":"c1","stream":"after"}` + "\n")
	for _, tc := range []struct {
		name    string
		size    int
		deliver bool
	}{
		{"exactly maxFrame", maxFrame, true},
		{"one byte over", maxFrame + 1, false},
		{"just under a read buffer over", maxFrame + 64<<10 - 1, false},
		{"far over", maxFrame + 1<<20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engineSide, runnerSide := net.Pipe()
			rc := newConn(engineSide, bufio.NewReaderSize(engineSide, 64<<10), nil)
			defer rc.begin(context.Background(), time.Time{})()
			go func() {
				defer runnerSide.Close()
				runnerSide.SetWriteDeadline(time.Now().Add(time.Minute))
				if _, err := runnerSide.Write(frame(tc.size)); err != nil {
					return
				}
				runnerSide.Write(after)
			}()
			var got []runnerFrame
			for {
				fr, err := rc.next("c1")
				if err != nil {
					break
				}
				if len(fr.Text) > maxFrame {
					t.Errorf("delivered a frame with %d bytes of text, over maxFrame (%d)", len(fr.Text), maxFrame)
				}
				fr.Text = ""
				got = append(got, fr)
			}
			switch {
			case tc.deliver && (len(got) != 2 || got[0].Op != "output" || got[1].Stream != "after"):
				t.Errorf("a line of %d bytes: frames %+v, want the output frame and the one after it", tc.size, got)
			case !tc.deliver && len(got) != 0:
				t.Errorf("a line of %d bytes (maxFrame %d): frames %+v, want none and the connection closed", tc.size, maxFrame, got)
			}
			if !rc.closed() {
				t.Error("the connection is still open")
			}
		})
	}
}

// cellFuzzHost is a fake host whose runner answers the first attempt of each
// cell with the fuzzed bytes (over the socket, or as the cell script's
// output), and KD:LOST after that.
type cellFuzzHost struct {
	*fakeenv.Env
	host   *fakeenv.Host
	stream bool // offer the socket fast path

	mu       sync.Mutex
	tmpl     []byte
	answered map[string]bool
	sent     []byte // the bytes sent for the current iteration, ids and token filled in
	sentDir  string // the kernel dir they were sent for
	conns    sync.WaitGroup
}

const fetchedSpill = "the full spilled output\n"

func newCellFuzzHost(stream bool) *cellFuzzHost {
	h := &cellFuzzHost{stream: stream, answered: map[string]bool{}}
	h.Env, h.host = fakeenv.Healthy()
	h.Env.Prepend(
		fakeenv.On("cell", h.cell),
		fakeenv.On("fetch", fakeenv.Reply(fetchedSpill)),
		fakeenv.On("answer", fakeenv.Reply("KD:OK\n")),
	)
	return h
}

// fill puts the cell id and the kernel's token into the template, and signs
// each "KD:RESULT $MAC " line with the MAC of the rest of that line, as the
// runner signs its result file.
func (h *cellFuzzHost) fill(dir, id string) []byte {
	token := h.token(dir)
	out := bytes.ReplaceAll(h.tmpl, []byte("$ID"), []byte(id))
	out = bytes.ReplaceAll(out, []byte("$DIR"), []byte(dir))
	out = bytes.ReplaceAll(out, []byte("$TOKEN"), []byte(token))
	lines := bytes.SplitAfter(out, []byte("\n"))
	for i, l := range lines {
		if body, ok := bytes.CutPrefix(l, []byte("KD:RESULT $MAC ")); ok {
			body = bytes.TrimRight(body, "\r\n")
			lines[i] = bytes.Replace(l, []byte("$MAC"), []byte(kernelauth.MAC(token, kernelauth.Result, string(body))), 1)
		}
	}
	return bytes.Join(lines, nil)
}

// token is the secret of the kernel in dir.
func (h *cellFuzzHost) token(dir string) string {
	for _, k := range h.host.Kernels() {
		if k.Dir == dir {
			return k.Token
		}
	}
	return ""
}

// first reports whether id has not been answered yet, and marks it.
func (h *cellFuzzHost) first(id string) bool {
	if h.answered[id] {
		return false
	}
	h.answered[id] = true
	return true
}

func (h *cellFuzzHost) cell(_ context.Context, c fakeenv.Call) (backends.Result, error) {
	a, err := fakeenv.ParseCell(c.Command)
	if err != nil {
		return backends.Result{Output: "KD:ERR " + err.Error() + "\n", ReturnCode: 99}, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stream || !h.first(a.ID) {
		return backends.Result{Output: "KD:LOST\n"}, nil
	}
	h.sent, h.sentDir = h.fill(a.Dir, a.ID), a.Dir
	return backends.Result{Output: string(h.sent)}, nil
}

// DialUnix is the runner's socket: it reads the cell request and answers
// with the fuzzed bytes, then hangs up.
func (h *cellFuzzHost) DialUnix(_ context.Context, sock string) (net.Conn, error) {
	if !h.stream {
		return nil, errors.New("no streams")
	}
	engineSide, runnerSide := net.Pipe()
	dir := path.Dir(sock)
	h.conns.Add(1)
	go func() {
		defer h.conns.Done()
		defer runnerSide.Close()
		runnerSide.SetDeadline(time.Now().Add(10 * time.Second))
		// The runner's side of the handshake, with the kernel's secret.
		h.mu.Lock()
		token := h.token(dir)
		h.mu.Unlock()
		nonce := kernelauth.NewNonce()
		fmt.Fprintf(runnerSide, "{\"op\":\"hello\",\"nonce\":%q}\n", nonce)
		dec := json.NewDecoder(runnerSide)
		var auth struct{ Op, MAC, Nonce string }
		if dec.Decode(&auth) != nil || auth.Op != "auth" || !kernelauth.Valid(token, auth.MAC, kernelauth.Engine, nonce) {
			return
		}
		fmt.Fprintf(runnerSide, "{\"op\":\"auth_ok\",\"mac\":%q}\n", kernelauth.MAC(token, kernelauth.Runner, auth.Nonce))
		var req struct {
			Op string `json:"op"`
			ID string `json:"id"`
		}
		if dec.Decode(&req) != nil || req.Op != "cell" {
			return
		}
		// Keep reading (interrupts, tool answers) so the engine never blocks.
		h.conns.Add(1)
		go func() {
			defer h.conns.Done()
			io.Copy(io.Discard, io.MultiReader(dec.Buffered(), runnerSide))
		}()
		h.mu.Lock()
		var out []byte
		if h.first(req.ID) {
			out = h.fill(dir, req.ID)
			h.sent, h.sentDir = out, dir
		}
		h.mu.Unlock()
		runnerSide.Write(out)
	}()
	return engineSide, nil
}

// fuzzFrame is the runner's frame as the oracle decodes it: the same type,
// so a field added to runnerFrame cannot be missed here.
type fuzzFrame = runnerFrame

// cellExpect is what the caller must get for one runner answer.
type cellExpect struct {
	frame   *fuzzFrame // a well-formed result for the cell
	pubFail bool       // Execute returns an error
	// tokenShown: the token is in runner text the engine may pass on (a
	// result field, a malformed result, a host message); otherwise it was
	// only inside forwarded tool requests and must appear nowhere.
	tokenShown bool
}

// markerLine reports whether out has the marker as a line of its own or
// followed by a space (the host protocol's rule).
func markerLine(out, marker string) bool {
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimRight(l, "\r")
		if l == marker || strings.HasPrefix(l, marker+" ") {
			return true
		}
	}
	return false
}

// expectExec reads a cell script's output as the protocol defines it.
func expectExec(out, id, token string) cellExpect {
	var x cellExpect
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "KD:RPC "):
			// The name is the host's (sanitized there) and is quoted in
			// rejections; only the request itself is the kernel's.
			name, data, _ := strings.Cut(strings.TrimPrefix(l, "KD:RPC "), " ")
			x.tokenShown = x.tokenShown || strings.Contains(name, token) || tokenOutsideTokenField(data, token)
		case strings.HasPrefix(l, "KD:RPCBAD "):
			x.tokenShown = x.tokenShown || strings.Contains(l, token) // name and reason are quoted
		case strings.HasPrefix(l, "KD:RPC"):
			// other KD:RPC lines are never quoted
		case strings.Contains(l, token):
			x.tokenShown = true
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "KD:RESULT "); ok {
			mac, body, _ := strings.Cut(strings.TrimRight(rest, "\r"), " ")
			var fr fuzzFrame
			if kernelauth.Valid(token, mac, kernelauth.Result, body) && json.Unmarshal([]byte(body), &fr) == nil && fr.ID == id {
				x.frame = &fr
			}
			return x
		}
	}
	// The first marker in the engine's order decides; waiting markers lead
	// to a next round trip, which says KD:LOST.
	for _, m := range []string{"KD:RPCWAIT", "KD:PENDING", "KD:DEAD", "KD:GONE", "KD:LOST", "KD:PUBFAIL"} {
		if markerLine(out, m) {
			x.pubFail = m == "KD:PUBFAIL"
			break
		}
	}
	return x
}

// expectStream reads socket frames as the engine must: complete lines that
// decode, the first result or error for the cell wins.
func expectStream(data []byte, id, token string) cellExpect {
	var x cellExpect
	for _, l := range bytes.SplitAfter(data, []byte("\n")) {
		if !bytes.HasSuffix(l, []byte("\n")) {
			break
		}
		var fr fuzzFrame
		if json.Unmarshal(l, &fr) != nil {
			continue
		}
		if fr.Op == "rpc" {
			x.tokenShown = x.tokenShown || tokenOutsideTokenField(fr.Data, token) || strings.Contains(fr.Name+" "+fr.Error, token)
		} else if bytes.Contains(l, []byte(token)) {
			x.tokenShown = true
		}
		switch {
		case fr.Op == "result" && fr.ID == id:
			x.frame = &fr
			return x
		case fr.Op == "error" && fr.ID == id:
			x.pubFail = true
			return x
		}
	}
	return x
}

// tokenOutsideTokenField reports whether a forwarded tool request holds the
// token anywhere but as its "token" field. A request that carries the
// right token in, say, its "cell" field was written by someone who knows
// the token, and rejection messages may quote such fields; the token field
// itself must never be quoted.
func tokenOutsideTokenField(req, token string) bool {
	for _, field := range []string{`"token":"` + token + `"`, `"token": "` + token + `"`} {
		req = strings.ReplaceAll(req, field, "")
	}
	return strings.Contains(req, token)
}

var cellResultSeeds = []string{
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"ok","displays":[{"data":{"text/plain":"'a'"}},{"data":{"image/gif":"R0lGODlh","text/plain":"g"},"spill":{"image/png":"$DIR/cells/$ID.d1.png"}}]}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"ok","stdout":"42\n","stderr":"","traceback":"","execution_count":1,"duration_ms":0.5}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"error","stderr":"e","traceback":"Traceback...\nZeroDivisionError\n","execution_count":3}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"exit","traceback":"SystemExit: 3\n"}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"exit"}` + "\r\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"interrupted","traceback":"KeyboardInterrupt\n"}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"weird","stdout":"x"}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"ok","stdout":"head","stdout_clipped":true,"stdout_spill":"$DIR/cells/$ID.out","stderr_clipped":true,"stderr_spill":"/etc/passwd"}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","stdout_clipped":true,"stdout_spill":"$DIR/cells/../../x"}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"someone-else","status":"ok"}` + "\n",
	`KD:RESULT $MAC {"op":"result","id":"$ID","status":"ok","execution_count":"1"}` + "\n",
	"KD:RESULT $MAC {truncated\n",
	"KD:RESULT $MAC \n",
	`KD:RESULT {"op":"result","id":"$ID","status":"ok","stdout":"unsigned"}` + "\n",
	`KD:RESULT 00 {"op":"result","id":"$ID","status":"ok","stdout":"wrongly signed"}` + "\n",
	"noise\nKD:PENDING\n",
	"KD:DEAD\n",
	"KD:GONE\n",
	"KD:LOST\n",
	"bash: mv: Permission denied\nKD:PUBFAIL\n",
	"KD:RPC 1.req {\"seq\":1,\"tool\":\"noop\",\"args\":{},\"token\":\"$TOKEN\",\"cell\":\"$ID\"}\nKD:RPCWAIT\n",
	"KD:RPC 2.req {\"seq\":2,\"tool\":\"noop\",\"token\":\"$TOKEN\",\"cell\":\"$ID\"}\nKD:PUBFAIL\n",
	"KD:RPCBAD 3.req oversized:-more-than-1-bytes\nKD:RPC 4.req {\"token\":\"$TOKEN\"\nsomething unexpected\n",
	"KD:RPC 5.req {\"seq\":5,\"tool\":\"noop\",\"token\":\"$TOKEN\",\"cell\":\"$TOKEN\"}\nKD:RPCWAIT\n",
	"KD:RPC 6.req {\"seq\":\"$TOKEN\",\"tool\":\"noop\",\"token\":\"$TOKEN\",\"cell\":\"$ID\"}\nKD:RPCWAIT\n",
	"",
}

var streamResultSeeds = []string{
	`{"op":"result","id":"$ID","status":"ok","displays":[{"data":{"text/plain":"1","image/png":"iVBORw0KGgo="}},{"data":{"text/html":"<b>x</b>","bad mime":"x"},"metadata":{"a":1},"note":"n"}]}` + "\n",
	`{"op":"result","id":"$ID","status":"ok","displays":[{"data":{"image/png":"not base64!"},"metadata":"x","spill":{"image/png":"/etc/passwd"}}],"displays_dropped":-5}` + "\n",
	`{"op":"result","id":"$ID","status":"ok","displays":[{"data":null},{},{"data":{"text/plain":7}}],"displays_dropped":1000000}` + "\n",
	`{"op":"result","id":"$ID","status":"ok","stdout":"42\n","execution_count":1}` + "\n",
	`{"op":"output","id":"$ID","stream":"stdout","text":"4"}` + "\n" + `{"op":"result","id":"$ID","status":"interrupted"}` + "\n",
	`{"op":"result","id":"other","status":"ok"}` + "\n" + `{"op":"result","id":"$ID","status":"error","traceback":"x"}` + "\n",
	`{"op":"error","id":"$ID","error":"cannot write the request"}` + "\n",
	`{"op":"rpc","name":"1.req","data":"{\"seq\":1,\"tool\":\"noop\",\"args\":{},\"token\":\"$TOKEN\",\"cell\":\"$ID\"}"}` + "\n" + `{"op":"result","id":"$ID","status":"ok"}` + "\n",
	`{"op":"result","id":"$ID","status":"ok","stdout_clipped":true,"stdout_spill":"$DIR/cells/$ID.out"}` + "\n",
	`{"op":"result","id":"$ID","status":"ok"}`,
	"garbage\n",
	"",
}

// FuzzCellResult runs a cell through Engine.Execute on a fake host whose
// runner answers with the fuzzed bytes ($ID, $DIR and $TOKEN are filled in
// with the cell id, the kernel dir and the kernel's RPC token), over the
// cell script's output or, with stream set, over the runner's socket. It
// checks, against an independent reading of those bytes: no panic; the
// status is only success, error, timeout or interrupted, mapped from the
// runner's status as documented; output, traceback and the clipped flags
// are passed on intact; a spill file is copied only from the kernel's own
// cells dir, into the state dir, 0600; a malformed or foreign result is an
// error with state_lost; only a publish failure is an Execute error; and a
// token the runner sent only inside forwarded tool requests appears in no
// result, error or event.
func FuzzCellResult(f *testing.F) {
	for _, s := range cellResultSeeds {
		f.Add([]byte(s), false)
	}
	for _, s := range streamResultSeeds {
		f.Add([]byte(s), true)
	}
	reg := hosttools.NewRegistry()
	if err := reg.Register(hosttools.Tool{Name: "noop", Description: "Answer ok.", Handler: func(context.Context, hosttools.Call) (hosttools.Result, error) {
		return hosttools.Result{Text: "ok"}, nil
	}}); err != nil {
		f.Fatal(err)
	}
	hosts := map[bool]*cellFuzzHost{false: newCellFuzzHost(false), true: newCellFuzzHost(true)}
	hosts[true].SetURI("fake-stream")
	stateDir := f.TempDir()
	e, err := New(Config{Backends: []backends.Env{hosts[false], hosts[true]}, StateDir: stateDir,
		CellTimeout: 10 * time.Second, InterruptGrace: 100 * time.Millisecond, WaitWindow: time.Second,
		Tools: reg, Approvals: Approvals{Default: PolicyAllow}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		e.Close(ctx, false)
		for _, h := range hosts {
			h.conns.Wait()
		}
	})
	f.Fuzz(func(t *testing.T, tmpl []byte, stream bool) {
		h := hosts[stream]
		h.mu.Lock()
		h.tmpl, h.sent, h.sentDir = tmpl, nil, ""
		h.mu.Unlock()
		sub := e.Subscribe(1 << 14)
		defer sub.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := e.Execute(ctx, Request{Owner: "o", Backend: h.URI(), Tools: []string{"noop"}, Code: "print(42)"})
		// Every iteration starts from a fresh kernel.
		e.ShutdownAll(ctx)
		h.conns.Wait()

		h.mu.Lock()
		sent, sentDir := h.sent, h.sentDir
		var cellID string
		for id := range h.answered {
			cellID = id
		}
		clear(h.answered)
		h.mu.Unlock()
		if cellID == "" {
			t.Fatalf("the runner was never asked for the cell (res %+v, err %v)", res, err)
		}
		// The token of the kernel the cell went to: the engine must never
		// show it unless the runner itself put it in its answer.
		var token, kdir string
		for _, k := range h.host.Kernels() {
			if k.Dir == sentDir {
				token = k.Token
			}
		}
		if token == "" {
			t.Fatalf("no kernel at %s on the fake host", sentDir)
		}
		if res != nil && res.Kernel != nil {
			kdir = res.Kernel.Dir
		}
		var x cellExpect
		if stream {
			x = expectStream(sent, cellID, token)
		} else {
			x = expectExec(string(sent), cellID, token)
		}

		var events []string
	drain:
		for {
			select {
			case ev := <-sub.C:
				events = append(events, string(ev.Type)+": "+ev.Detail)
			default:
				break drain
			}
		}
		if res != nil {
			checkDisplays(t, res)
		}
		if !x.tokenShown {
			var texts []string
			if err != nil {
				texts = append(texts, err.Error())
			}
			if res != nil {
				texts = append(texts, res.Stdout, res.Stderr, res.Traceback, res.SpillPath, res.StderrSpillPath)
				if res.Kernel != nil {
					texts = append(texts, res.Kernel.Note)
				}
			}
			for _, s := range append(texts, events...) {
				if strings.Contains(s, token) {
					t.Fatalf("the RPC token, sent only inside tool requests, leaked into %q\n(runner sent %q)", s, sent)
				}
			}
		}

		if x.pubFail {
			if err == nil || !strings.Contains(err.Error(), "publish") {
				t.Fatalf("runner sent %q: want a publish error, got %+v, %v", sent, res, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("runner sent %q: Execute failed: %v", sent, err)
		}
		switch res.Status {
		case "success", "error", "timeout", "interrupted":
		default:
			t.Fatalf("runner sent %q: status %q", sent, res.Status)
		}
		if res.Kernel == nil {
			t.Fatalf("runner sent %q: no kernel in the result %+v", sent, res)
		}
		if x.frame == nil {
			if res.Status != "error" || !res.Kernel.StateLost || res.Stdout != "" || res.SpillPath != "" || !strings.HasPrefix(res.Traceback, "kerneldeck: ") {
				t.Fatalf("runner sent %q, no valid result for cell %s: want an error with state_lost, got %+v (kernel %+v)", sent, cellID, res, res.Kernel)
			}
			return
		}
		fr := x.frame
		want := "error"
		switch fr.Status {
		case "ok":
			want = "success"
		case "exit":
			if fr.Traceback == "" {
				want = "success"
			}
		case "interrupted":
			want = "interrupted"
		}
		if string(res.Status) != want {
			t.Fatalf("runner status %q (traceback %q): result status %q, want %q", fr.Status, fr.Traceback, res.Status, want)
		}
		if res.Stdout != fr.Stdout || res.Stderr != fr.Stderr || res.Traceback != fr.Traceback ||
			res.StdoutClipped != fr.StdoutClipped || res.StderrClipped != fr.StderrClipped {
			t.Fatalf("runner sent %+v: result %+v does not carry it over", fr, res)
		}
		// (StateLost may be set: each iteration's kernel replaces the one the
		// last iteration shut down, and the engine says that state is gone.)
		if res.Kernel.ExecutionCount != fr.ExecutionCount || res.Kernel.StateReset {
			t.Fatalf("runner sent %+v: kernel %+v", fr, res.Kernel)
		}
		for _, sp := range []struct{ host, local, suffix string }{
			{fr.StdoutSpill, res.SpillPath, ".stdout"}, {fr.StderrSpill, res.StderrSpillPath, ".stderr"},
		} {
			inCells := sp.host != "" && path.Dir(sp.host) == kdir+"/cells"
			if !inCells {
				if sp.local != "" {
					t.Fatalf("spill %q is outside the kernel's cells dir %s, but was copied to %s", sp.host, kdir+"/cells", sp.local)
				}
				continue
			}
			wantLocal := filepath.Join(stateDir, "spill", res.Kernel.ID, cellID+sp.suffix)
			if sp.local != wantLocal {
				t.Fatalf("spill %q copied to %q, want %q", sp.host, sp.local, wantLocal)
			}
			st, err := os.Lstat(sp.local)
			if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
				t.Fatalf("spill copy %s: %v, %v; want a 0600 file", sp.local, st, err)
			}
			if data, _ := os.ReadFile(sp.local); string(data) != fetchedSpill {
				t.Fatalf("spill copy %s holds %q, want what the host sent", sp.local, data)
			}
		}
	})
}

// checkDisplays holds a result's displays to the engine's bounds, whatever
// the runner sent.
func checkDisplays(t *testing.T, res *Result) {
	t.Helper()
	if len(res.Displays) > maxDisplays {
		t.Fatalf("%d displays, at most %d", len(res.Displays), maxDisplays)
	}
	total := 0
	for _, d := range res.Displays {
		if _, ok := d.Data["text/plain"]; !ok {
			t.Fatalf("a display without text/plain: %+v", d)
		}
		for m, v := range d.Data {
			if !mimeType.MatchString(m) {
				t.Fatalf("display key %q is not a MIME type", m)
			}
			if binaryMIME(m) {
				if _, err := base64.StdEncoding.DecodeString(v); err != nil {
					t.Fatalf("%s that is not base64 got through", m)
				}
			}
			total += len(v)
		}
		if len(d.Metadata) > 0 && !json.Valid(d.Metadata) {
			t.Fatalf("metadata that is not JSON: %q", d.Metadata)
		}
		for m, p := range d.Spill {
			if !strings.Contains(p, "spill") {
				t.Fatalf("spilled %s is not in the state dir: %s", m, p)
			}
		}
	}
	if total > maxDisplaysResult {
		t.Fatalf("%d bytes of displays, at most %d", total, maxDisplaysResult)
	}
}
