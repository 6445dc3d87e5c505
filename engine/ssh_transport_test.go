package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// The SSH transport against a real OpenSSH sshd on loopback: exact round
// trips per cell and remote shell start-ups counted by the user's own
// .bashrc (the proof that a warm cell pays no shell start-up), connection
// drops mid-cell and between cells (exactly once, same kernel), a host that
// stays unreachable past the timeout (an error, never a hang), and 50
// concurrent cells on one host (nothing refused by MaxSessions).

const (
	stHeavyUser  = "kdheavy"
	stHeavySleep = 200 * time.Millisecond
	stWarmCells  = 10
	// stHang is the guard against a call that never returns; it is far above
	// anything these tests should take and is not a speed assertion.
	stHang = 60 * time.Second
)

// stRig is one engine over a Counting ssh backend for one user.
type stRig struct {
	ssh *backends.SSH
	c   backendtest.Counting
	eng *engine.Engine
	log *enginetest.EventLog
}

// stNewRig opens the ssh backend for u (through sshEnv), hides its fast path
// when executeOnly, counts its round trips and starts an engine on it.
func stNewRig(t *testing.T, srv *sshdtest.Server, u *sshdtest.User, executeOnly bool, mutate func(*engine.Config)) *stRig {
	t.Helper()
	r := &stRig{ssh: sshEnv(t, srv, u, nil)}
	var env backends.Env = r.ssh
	if executeOnly {
		env = backends.ExecuteOnly(env)
	}
	r.c = backendtest.NewCounting(env)
	if hasStreams := backends.StreamsOf(r.c) != nil; hasStreams == executeOnly {
		t.Fatalf("counting ssh backend offers streams: %v, want %v", hasStreams, !executeOnly)
	}
	cfg := engine.Config{Backends: []backends.Env{r.c}, StateDir: t.TempDir(), CellTimeout: 60 * time.Second}
	if mutate != nil {
		mutate(&cfg)
	}
	eng, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.eng = eng
	r.log = enginetest.NewEventLog(eng)
	t.Cleanup(func() { rtClose(t, eng) })
	return r
}

// events returns every event seen so far.
func (r *stRig) events() []engine.Event { return r.log.All() }

func (r *stRig) count(types ...engine.EventType) int {
	n := 0
	for _, ev := range r.events() {
		if slices.Contains(types, ev.Type) {
			n++
		}
	}
	return n
}

func (r *stRig) eventLog() string {
	var b strings.Builder
	for _, ev := range r.events() {
		fmt.Fprintf(&b, "  %s %s %s\n", ev.Type, ev.Kernel, ev.Detail)
	}
	return b.String()
}

// stCall is an Execute running in the background.
type stCall struct {
	done  chan struct{}
	res   *engine.Result
	err   error
	start time.Time
	took  time.Duration
}

func stGo(eng *engine.Engine, req engine.Request) *stCall {
	c := &stCall{done: make(chan struct{}), start: time.Now()}
	go func() {
		defer close(c.done)
		c.res, c.err = eng.Execute(context.Background(), req)
		c.took = time.Since(c.start)
	}()
	return c
}

// wait returns the call's result, failing the test if it hangs past within.
func (c *stCall) wait(t *testing.T, within time.Duration) (*engine.Result, error) {
	t.Helper()
	select {
	case <-c.done:
		return c.res, c.err
	case <-time.After(within - time.Since(c.start)):
		t.Fatalf("Execute hung: no result %v after it started", within)
		return nil, nil
	}
}

// stWaitFile waits until path holds want (the cell has reached that point).
func stWaitFile(t *testing.T, path, want string, call *stCall) {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if string(b) == want {
			return
		}
		select {
		case <-call.done:
			t.Fatalf("the cell returned before writing %q to %s: %v, %+v", want, path, call.err, call.res)
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("%s holds %q after 30 s, want %q", path, b, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func stReadFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func stHeavy(t *testing.T, srv *sshdtest.Server) *sshdtest.User {
	t.Helper()
	u := srv.User(t, stHeavyUser, sshdtest.UserOptions{BashrcSleep: stHeavySleep})
	// The heavy start-up is real: the block is at the top of the user's own
	// ~/.bashrc, which bash sources for every command sshd runs.
	if rc := stReadFile(t, u.Bashrc); !strings.HasPrefix(rc, sshdtest.BashrcBlock(stHeavySleep)) {
		t.Fatalf("%s does not start with the heavy block:\n%s", u.Bashrc, rc)
	}
	return u
}

// stAccepted counts the authenticated connections sshd logged for name.
func stAccepted(srv *sshdtest.Server, name string) int {
	return strings.Count(srv.Log(), "Accepted publickey for "+name+" ")
}

// stRequireNoRefusal fails if sshd refused a channel or session in its log
// from byte offset from on.
func stRequireNoRefusal(t *testing.T, srv *sshdtest.Server, from int, when string) {
	t.Helper()
	var bad []string
	for line := range strings.SplitSeq(srv.Log()[from:], "\n") {
		l := strings.ToLower(line)
		if strings.Contains(l, "refused") || strings.Contains(l, "no more sessions") {
			bad = append(bad, line)
		}
	}
	if len(bad) > 0 {
		t.Errorf("sshd refused %d request(s) %s:\n%s", len(bad), when, strings.Join(bad, "\n"))
	}
}

// Exact round trips over ssh. Fast path: spawn + first cell = 1 Execute (the
// spawn) + 1 cell frame on a direct-streamlocal channel; a warm cell = 0
// Execute + 1 frame on the same channel (one dial for the kernel's life).
// Plain Execute: 2, then exactly 1 per warm cell. For a user whose .bashrc
// sleeps 0.2 s the counts are the same: only the spawn starts a remote
// shell, so the per-cell cost of the fast path has no shell start-up in it.
func TestSSHRoundTrips(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	users := map[string]*sshdtest.User{
		"light": srv.User(t, "kdtest1", sshdtest.UserOptions{}),
		"heavy": stHeavy(t, srv),
	}
	for _, who := range []string{"light", "heavy"} {
		u := users[who]
		t.Run("stream/"+who, func(t *testing.T) {
			r := stNewRig(t, srv, u, false, nil)
			first := rtExec(t, r.eng, engine.Request{Owner: "rt", Code: "x = 41\nprint(x + 1)"})
			if first.Stdout != "42\n" || first.Kernel.Reused || first.Kernel.ExecutionCount != 1 {
				t.Fatalf("first cell: stdout %q kernel %+v", first.Stdout, first.Kernel)
			}
			if got := rtSnapshot(r.c); got.Executes != 1 || got.Spawns != 1 || got.Frames != 1 || got.CellFrames != 1 {
				t.Fatalf("spawn + first cell over ssh cost %+v, want exactly 1 Execute (spawn) + 1 cell frame", got)
			}
			var lat []time.Duration
			for i := range stWarmCells {
				before := rtSnapshot(r.c)
				start := time.Now()
				res := rtExec(t, r.eng, engine.Request{Owner: "rt", Code: "x += 1\nx"})
				lat = append(lat, time.Since(start))
				if !res.Kernel.Reused || res.Kernel.ID != first.Kernel.ID || res.Kernel.ExecutionCount != i+2 || res.Stdout != fmt.Sprint(42+i)+"\n" {
					t.Fatalf("warm cell %d: stdout %q kernel %+v", i, res.Stdout, res.Kernel)
				}
				after := rtSnapshot(r.c)
				if after.Executes != before.Executes || after.Frames-before.Frames != 1 || after.CellFrames-before.CellFrames != 1 {
					t.Fatalf("warm cell %d over ssh cost %d Execute calls and %d frames (%d cell frames), want 0 and 1",
						i, after.Executes-before.Executes, after.Frames-before.Frames, after.CellFrames-before.CellFrames)
				}
			}
			if r.c.Dials() != 1 {
				t.Errorf("%d stream dials for one kernel, want 1 (the channel is kept)", r.c.Dials())
			}
			rtRequireOnly(t, r.c, "spawn")
			if n := stAccepted(srv, u.Name); n != 1 {
				t.Errorf("sshd accepted %d connections for %s, want 1 shared connection", n, u.Name)
			}
			rtRequireCompiledSpawn(t, r.eng, r.c, "")
			slices.Sort(lat)
			t.Logf("%s: warm cell median %v over %d cells (informational)", u.Name, lat[len(lat)/2], len(lat))
		})
		t.Run("execute/"+who, func(t *testing.T) {
			r := stNewRig(t, srv, u, true, nil)
			first := rtExec(t, r.eng, engine.Request{Owner: "rt", Code: "x = 41\nprint(x + 1)"})
			if first.Stdout != "42\n" || first.Kernel.Reused || first.Kernel.ExecutionCount != 1 {
				t.Fatalf("first cell: stdout %q kernel %+v", first.Stdout, first.Kernel)
			}
			if got := rtSnapshot(r.c); got.Executes != 2 || got.Spawns != 1 || got.Cells != 1 || got.Frames != 0 {
				t.Fatalf("spawn + first cell over ssh Execute cost %+v, want exactly 2 Execute calls (1 spawn + 1 cell)", got)
			}
			for i := range stWarmCells {
				before := rtExecutes(r.c)
				res := rtExec(t, r.eng, engine.Request{Owner: "rt", Code: "x += 1\nx"})
				if !res.Kernel.Reused || res.Kernel.ID != first.Kernel.ID || res.Kernel.ExecutionCount != i+2 || res.Stdout != fmt.Sprint(42+i)+"\n" {
					t.Fatalf("warm cell %d: stdout %q kernel %+v", i, res.Stdout, res.Kernel)
				}
				if d := rtExecutes(r.c) - before; d != 1 {
					t.Fatalf("warm cell %d over ssh Execute cost %d Execute calls, want exactly 1; markers so far %v", i, d, r.c.Markers())
				}
			}
			rtRequireOnly(t, r.c, "spawn", "cell")
			if got := rtSnapshot(r.c); got.Cells != 1+stWarmCells || got.Frames != 0 {
				t.Fatalf("after %d cells: %+v", 1+stWarmCells, got)
			}
		})
	}
}

// stDropTimeout is the timeout of a cell whose connection is dropped: four
// times what the cell sleeps, so only a result that is lost or stuck on the
// host (not a slow machine) makes the call miss it.
const stDropTimeout = 12 * time.Second

// stDropCode appends one line to path (the record that the code ran), then
// sleeps while the test drops the connection, then answers.
func stDropCode(path string) string {
	return fmt.Sprintf("import time\nwith open(%q, \"a\") as f:\n    f.write(\"ran\\n\")\ntime.sleep(3)\nx += 1\nprint(\"slept\", x)", path)
}

// A connection that drops while a cell runs must not lose the cell nor run
// it twice: sshd's processes serving the user's connection are killed while
// the cell sleeps (on the fast path that kills the channel the result would
// come back on; over plain Execute it kills the waiting command). The result
// still arrives, the code ran once, and the kernel lives on with its state.
func TestSSHDropMidCell(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	for _, mode := range []struct {
		name        string
		executeOnly bool
	}{{"stream", false}, {"execute", true}} {
		t.Run(mode.name, func(t *testing.T) {
			r := stNewRig(t, srv, u, mode.executeOnly, nil)
			first := rtExec(t, r.eng, engine.Request{Owner: "drop", Code: "x = 1"})
			marker := filepath.Join(first.Kernel.Dir, "ran-"+mode.name+".txt")
			before := rtSnapshot(r.c)
			dialsBefore := r.c.Dials()

			call := stGo(r.eng, engine.Request{Owner: "drop", Code: stDropCode(marker), Timeout: stDropTimeout})
			stWaitFile(t, marker, "ran\n", call)
			if n := srv.KillSessions(t, u.Name); n < 1 {
				t.Fatalf("KillSessions(%s) dropped %d connections, want at least 1", u.Name, n)
			}
			res, err := call.wait(t, stHang)
			if err != nil {
				t.Fatalf("cell across a dropped connection: %v\nevents:\n%s", err, r.eventLog())
			}
			if res.Status != "success" || res.Stdout != "slept 2\n" || res.Fallback != "" || res.Kernel == nil {
				t.Fatalf("cell across a dropped connection: status %q stdout %q traceback %q fallback %q kernel %+v\nevents:\n%s",
					res.Status, res.Stdout, res.Traceback, res.Fallback, res.Kernel, r.eventLog())
			}
			if k := res.Kernel; k.ID != first.Kernel.ID || k.PID != first.Kernel.PID || !k.Reused || k.StateLost || k.ExecutionCount != 2 {
				t.Fatalf("cell across a dropped connection ran in %+v, want the same kernel %s (pid %d), execution_count 2, state kept",
					k, first.Kernel.ID, first.Kernel.PID)
			}
			if got := stReadFile(t, marker); got != "ran\n" {
				t.Fatalf("the cell's code ran %d times (%q), want exactly once", strings.Count(got, "ran"), got)
			}
			// The drop really hit the cell: its result could not come back on
			// the first stream or the first wait command.
			after := rtSnapshot(r.c)
			if mode.executeOnly {
				if after.Cells-before.Cells < 2 {
					t.Fatalf("the cell cost %d cell commands: the drop did not interrupt its wait (markers %v)", after.Cells-before.Cells, after.Markers)
				}
				if r.count(engine.EventTransportError) == 0 {
					t.Errorf("no transport_error event for the killed wait command\nevents:\n%s", r.eventLog())
				}
			} else if after.Cells == before.Cells && r.c.Dials() == dialsBefore {
				t.Fatalf("the result came back over the killed stream: no new dial and no cell command (%+v)", after)
			}
			if after.Spawns != before.Spawns || r.count(engine.EventStateLost, engine.EventSpawnFailed, engine.EventFallbackPerCall) != 0 {
				t.Fatalf("the drop cost a respawn or a fallback: %+v\nevents:\n%s", after, r.eventLog())
			}
			t.Logf("%d reconnected/transport_error events; %d cell commands and %d dials after the drop",
				r.count(engine.EventReconnected, engine.EventTransportError), after.Cells-before.Cells, r.c.Dials()-dialsBefore)

			// The kernel is reused by the next call, with its state.
			next := rtExec(t, r.eng, engine.Request{Owner: "drop", Code: "x"})
			if next.Stdout != "2\n" || next.Kernel.ID != first.Kernel.ID || next.Kernel.PID != first.Kernel.PID || !next.Kernel.Reused || next.Kernel.ExecutionCount != 3 {
				t.Fatalf("next call: stdout %q kernel %+v, want 2 from kernel %s (pid %d), execution_count 3", next.Stdout, next.Kernel, first.Kernel.ID, first.Kernel.PID)
			}
			if got := stReadFile(t, marker); got != "ran\n" {
				t.Fatalf("the dropped cell's code ran again later: %q", got)
			}
			if n := r.count(engine.EventSpawned); n != 1 {
				t.Fatalf("%d spawned events, want 1\nevents:\n%s", n, r.eventLog())
			}
		})
	}
}

// Drops mid-cell over plain Execute, again and again on one kernel. Each drop
// leaves the killed wait command running on the host (as after a network
// blip), next to the engine's new wait for the same cell: the new wait must
// still collect the result as soon as it is there, and each cell runs once.
func TestSSHDropMidCellRepeated(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	r := stNewRig(t, srv, u, true, nil)
	first := rtExec(t, r.eng, engine.Request{Owner: "again", Code: "x = 0"})
	marker := filepath.Join(first.Kernel.Dir, "ran-again.txt")
	const rounds = 8
	for i := 1; i <= rounds; i++ {
		code := fmt.Sprintf("import time\nwith open(%q, \"a\") as f:\n    f.write(\"%d\\n\")\ntime.sleep(1.5)\nx += 1\nprint(x)", marker, i)
		call := stGo(r.eng, engine.Request{Owner: "again", Code: code, Timeout: stDropTimeout})
		want := ""
		for j := 1; j <= i; j++ {
			want += fmt.Sprintf("%d\n", j)
		}
		stWaitFile(t, marker, want, call)
		if n := srv.KillSessions(t, u.Name); n < 1 {
			t.Fatalf("round %d: KillSessions(%s) dropped %d connections, want at least 1", i, u.Name, n)
		}
		res, err := call.wait(t, stHang)
		if err != nil {
			t.Fatalf("round %d: %v\nevents:\n%s", i, err, r.eventLog())
		}
		if res.Status != "success" || res.Stdout != fmt.Sprintf("%d\n", i) || res.Kernel == nil ||
			res.Kernel.PID != first.Kernel.PID || res.Kernel.StateLost || res.Kernel.ExecutionCount != i+1 {
			t.Fatalf("round %d (after %v): status %q stdout %q traceback %q kernel %+v; want %d from kernel pid %d\nevents:\n%s",
				i, call.took, res.Status, res.Stdout, res.Traceback, res.Kernel, i, first.Kernel.PID, r.eventLog())
		}
		if got := stReadFile(t, marker); got != want {
			t.Fatalf("round %d: marker %q, want %q (each cell exactly once)", i, got, want)
		}
	}
}

// A drop between two calls (right after a cell finished) is noticed on the
// next call, which re-dials and reaches the same kernel with its state.
func TestSSHDropBetweenCells(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	for _, mode := range []struct {
		name        string
		executeOnly bool
	}{{"stream", false}, {"execute", true}} {
		t.Run(mode.name, func(t *testing.T) {
			r := stNewRig(t, srv, u, mode.executeOnly, nil)
			first := rtExec(t, r.eng, engine.Request{Owner: "between", Code: "x = 1\nx"})
			accepted := stAccepted(srv, u.Name)
			for i := 2; i <= 3; i++ {
				if n := srv.KillSessions(t, u.Name); n < 1 {
					t.Fatalf("KillSessions(%s) dropped %d connections, want at least 1", u.Name, n)
				}
				res, err := r.eng.Execute(context.Background(), engine.Request{Owner: "between", Code: "x += 1\nx", Timeout: 45 * time.Second})
				if err != nil {
					t.Fatalf("call %d after a drop: %v\nevents:\n%s", i, err, r.eventLog())
				}
				if res.Status != "success" || res.Stdout != fmt.Sprint(i)+"\n" || res.Kernel == nil {
					t.Fatalf("call %d after a drop: status %q stdout %q traceback %q kernel %+v", i, res.Status, res.Stdout, res.Traceback, res.Kernel)
				}
				if k := res.Kernel; k.ID != first.Kernel.ID || k.PID != first.Kernel.PID || !k.Reused || k.StateLost || k.ExecutionCount != i {
					t.Fatalf("call %d after a drop ran in %+v, want kernel %s (pid %d) with its state, execution_count %d", i, k, first.Kernel.ID, first.Kernel.PID, i)
				}
			}
			if n := r.c.ByMarker("spawn"); n != 1 || r.count(engine.EventSpawned) != 1 || r.count(engine.EventStateLost) != 0 {
				t.Fatalf("%d spawns after drops between cells, want 1 and no state_lost\nevents:\n%s", n, r.eventLog())
			}
			if got := stAccepted(srv, u.Name); got != accepted+2 {
				t.Errorf("sshd accepted %d new connections for two drops, want 2 (one re-dial each)", got-accepted)
			}
		})
	}
}

// A host that goes away during a cell and stays away past the cell's timeout
// gives an error that says so, soon after the timeout (never a hang); once
// the host is back, new calls work over a new connection.
func TestSSHHostUnreachable(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	r := stNewRig(t, srv, u, false, nil)
	first := rtExec(t, r.eng, engine.Request{Owner: "away", Code: "x = 1"})
	marker := filepath.Join(first.Kernel.Dir, "ran-away.txt")
	code := fmt.Sprintf("import time\nwith open(%q, \"a\") as f:\n    f.write(\"ran\\n\")\ntime.sleep(8)\nprint(\"late\")", marker)
	const timeout = 3 * time.Second

	call := stGo(r.eng, engine.Request{Owner: "away", Code: code, Timeout: timeout})
	stWaitFile(t, marker, "ran\n", call)
	srv.Stop(t)
	if n := srv.KillSessions(t, u.Name); n < 1 {
		t.Fatalf("KillSessions(%s) dropped %d connections, want at least 1", u.Name, n)
	}
	res, err := call.wait(t, stHang)
	t.Logf("unreachable host: result after %v (timeout %v)", call.took, timeout)
	if err != nil {
		t.Fatalf("cell on an unreachable host: %v\nevents:\n%s", err, r.eventLog())
	}
	if res.Kernel == nil {
		t.Fatalf("cell on an unreachable host: no kernel in %+v", res)
	}
	text := strings.ToLower(res.Traceback + "\n" + res.Kernel.Note)
	if res.Status != "error" || !strings.Contains(text, "unreachable") && !strings.Contains(text, "could not be reached") {
		t.Fatalf("cell on an unreachable host: status %q, traceback %q, note %q; want status error saying the host could not be reached\nevents:\n%s",
			res.Status, res.Traceback, res.Kernel.Note, r.eventLog())
	}
	if res.Kernel.StateLost {
		t.Errorf("unreachable host reported as state_lost (note %q): the engine cannot know the kernel is gone", res.Kernel.Note)
	}
	if r.count(engine.EventTransportError) == 0 {
		t.Errorf("no transport_error event while the host was unreachable\nevents:\n%s", r.eventLog())
	}

	// Back again: a new connection, and new calls work.
	accepted := stAccepted(srv, u.Name)
	srv.Restart(t)
	res2 := rtExec(t, r.eng, engine.Request{Owner: "fresh", Code: "print('back')"})
	if res2.Stdout != "back\n" || res2.Kernel.Reused {
		t.Fatalf("new owner after the restart: stdout %q kernel %+v", res2.Stdout, res2.Kernel)
	}
	if got := stAccepted(srv, u.Name); got <= accepted {
		t.Errorf("no new connection after the restart (%d accepted before, %d after)", accepted, got)
	}
	again, err := r.eng.Execute(context.Background(), engine.Request{Owner: "away", Code: "print('again')", Timeout: 45 * time.Second})
	if err != nil || again.Status != "success" || again.Stdout != "again\n" {
		t.Fatalf("the unreachable cell's owner after the restart: %v %+v", err, again)
	}
	t.Logf("owner of the unreachable cell after the restart: kernel %s (first %s), state lost %v, note %q",
		again.Kernel.ID, first.Kernel.ID, again.Kernel.StateLost, again.Kernel.Note)
	if got := stReadFile(t, marker); got != "ran\n" {
		t.Fatalf("the unreachable cell's code ran %d times (%q), want once", strings.Count(got, "ran"), got)
	}
}

// stConcurrent runs one cell per owner, all at once, and checks each printed
// its own owner; it returns the results by owner.
func stConcurrent(t *testing.T, r *stRig, owners []string, code func(owner string) string) map[string]*engine.Result {
	t.Helper()
	calls := map[string]*stCall{}
	for _, o := range owners {
		calls[o] = stGo(r.eng, engine.Request{Owner: o, Code: code(o), Timeout: 120 * time.Second})
	}
	out := map[string]*engine.Result{}
	for _, o := range owners {
		res, err := calls[o].wait(t, 3*time.Minute)
		switch {
		case err != nil:
			t.Errorf("owner %s: %v", o, err)
		case res.Status != "success" || res.Stdout != o+"\n" || res.Fallback != "" || res.Kernel == nil:
			t.Errorf("owner %s: status %q stdout %q stderr %q traceback %q fallback %q", o, res.Status, res.Stdout, res.Stderr, res.Traceback, res.Fallback)
		default:
			out[o] = res
		}
	}
	if t.Failed() {
		t.Fatalf("%d of %d concurrent cells failed\nevents:\n%s", len(owners)-len(out), len(owners), r.eventLog())
	}
	return out
}

func stOwners(prefix string, n int) []string {
	owners := make([]string, n)
	for i := range owners {
		owners[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return owners
}

// 50 concurrent cells for 50 owners on one host succeed over one shared
// connection: spawns queue for sessions (MaxSessions), cells use streams.
// Over plain Execute, 20 concurrent cells that each hold a session for a
// while queue for the 8 sessions instead of being refused.
func TestSSHConcurrentCells(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	bigCap := func(cfg *engine.Config) { cfg.MaxKernels = 60; cfg.CellTimeout = 120 * time.Second }

	t.Run("stream", func(t *testing.T) {
		from := len(srv.Log())
		r := stNewRig(t, srv, u, false, bigCap)
		owners := stOwners("own", 50)
		printOwner := func(o string) string { return fmt.Sprintf("print(%q)", o) }
		cold := stConcurrent(t, r, owners, printOwner)
		for o, res := range cold {
			if res.Kernel.Reused || res.Kernel.ExecutionCount != 1 {
				t.Errorf("owner %s, cold: kernel %+v", o, res.Kernel)
			}
		}
		if got := rtSnapshot(r.c); got.Spawns != 50 || got.Executes != 50 || got.CellFrames != 50 {
			t.Fatalf("50 cold cells cost %+v, want 50 spawns and 50 cell frames, nothing else", got)
		}
		if n := len(r.eng.Kernels()); n != 50 {
			t.Fatalf("%d kernels registered, want 50", n)
		}
		warm := stConcurrent(t, r, owners, printOwner)
		for o, res := range warm {
			if !res.Kernel.Reused || res.Kernel.ID != cold[o].Kernel.ID || res.Kernel.ExecutionCount != 2 {
				t.Errorf("owner %s, warm: kernel %+v, want kernel %s reused", o, res.Kernel, cold[o].Kernel.ID)
			}
		}
		if got := rtSnapshot(r.c); got.Executes != 50 || got.CellFrames != 100 {
			t.Fatalf("50 warm cells cost %+v, want no Execute and 50 more cell frames", got)
		}
		if n := stAccepted(srv, u.Name); n != 1 {
			t.Errorf("sshd accepted %d connections for %s, want 1 shared by all 50 kernels", n, u.Name)
		}
		stRequireNoRefusal(t, srv, from, "during 100 concurrent cells")
		stCloseAll(t, r, cold, srv, from)
	})

	t.Run("execute", func(t *testing.T) {
		from := len(srv.Log())
		r := stNewRig(t, srv, u, true, bigCap)
		owners := stOwners("exo", 20)
		slow := func(o string) string { return fmt.Sprintf("import time\ntime.sleep(0.5)\nprint(%q)", o) }
		results := stConcurrent(t, r, owners, slow)
		for o, res := range results {
			if res.Kernel.Reused || res.Kernel.ExecutionCount != 1 {
				t.Errorf("owner %s: kernel %+v", o, res.Kernel)
			}
		}
		// Each call cost exactly one spawn and one cell command: no session
		// was refused and retried.
		if got := rtSnapshot(r.c); got.Spawns != 20 || got.Cells != 20 || got.Executes != 40 {
			t.Fatalf("20 concurrent cells over Execute cost %+v, want 20 spawns + 20 cell commands", got)
		}
		if n := r.count(engine.EventTransportError); n != 0 {
			t.Fatalf("%d transport errors\nevents:\n%s", n, r.eventLog())
		}
		stRequireNoRefusal(t, srv, from, "during 20 concurrent cells")
		stCloseAll(t, r, results, srv, from)
	})
}

// stCloseAll closes the engine, which kills every kernel at once, and checks
// that each runner is gone from the host and no kill was refused.
func stCloseAll(t *testing.T, r *stRig, results map[string]*engine.Result, srv *sshdtest.Server, from int) {
	t.Helper()
	before := r.c.ByMarker("kill")
	rtClose(t, r.eng)
	if n := r.c.ByMarker("kill") - before; n != 1 {
		t.Errorf("closing %d kernels on one host took %d kill commands, want 1 naming them all", len(results), n)
	}
	if n := r.count(engine.EventKilled); n != len(results) {
		t.Errorf("%d killed events for %d kernels at close\nevents:\n%s", n, len(results), r.eventLog())
	}
	for _, res := range results {
		rtRequireGone(t, res.Kernel.PID)
	}
	stRequireNoRefusal(t, srv, from, "when the engine closed and killed every kernel at once")
}

// stRCCountUser is a user whose ~/.bashrc appends one byte to a counter file
// each time bash reads it, i.e. for every remote shell start-up.
func stRCCountUser(t *testing.T, srv *sshdtest.Server) (*sshdtest.User, func() int) {
	t.Helper()
	u := srv.User(t, "kdrcount", sshdtest.UserOptions{})
	rc := filepath.Join(u.Home, ".bashrc")
	counter := filepath.Join(u.Home, ".kerneldeck-rc-count")
	old, err := os.ReadFile(rc)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	mine := "printf x >>" + counter + "\n"
	old = []byte(strings.ReplaceAll(string(old), mine, "")) // left by a crashed run
	os.Remove(counter)
	// At the very top: Debian's .bashrc returns early for non-interactive shells.
	if err := os.WriteFile(rc, append([]byte(mine), old...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(rc, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(counter)
		if old == nil {
			os.Remove(rc)
		} else if err := os.WriteFile(rc, old, 0o644); err != nil {
			t.Errorf("restore %s: %v", rc, err)
		}
	})
	return u, func() int {
		b, _ := os.ReadFile(counter)
		return len(b)
	}
}

// Shell start-ups, counted by the remote user's own .bashrc: a warm cell on
// the fast path starts no remote shell at all, and a backend command (the
// spawn, or a cell over plain Execute) starts exactly one, the login shell
// sshd must run. Every extra shell costs the user's whole rc file again
// (0.2 s each for the heavy user, about 120 ms for root on the dev machine).
func TestSSHShellStartups(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u, startups := stRCCountUser(t, srv)

	// The counter works: one raw session exec reads .bashrc exactly once.
	sess, err := srv.Dial(t, u).NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Run("true"); err != nil {
		t.Fatal(err)
	}
	sess.Close()
	if n := startups(); n != 1 {
		t.Fatalf("one raw session exec read .bashrc %d times, want 1: the counter does not work", n)
	}

	t.Run("stream", func(t *testing.T) {
		r := stNewRig(t, srv, u, false, nil)
		before := startups()
		rtExec(t, r.eng, engine.Request{Owner: "rc", Code: "x = 1"})
		waitCompiles(t, r.c, 1)
		spawn := startups() - before - 1 // the runner's compile, once per host
		for i := range stWarmCells {
			n := startups()
			rtExec(t, r.eng, engine.Request{Owner: "rc", Code: "x += 1"})
			if d := startups() - n; d != 0 {
				t.Fatalf("warm cell %d on the fast path started the remote shell %d times, want 0", i, d)
			}
		}
		if spawn != 1 {
			t.Errorf("spawn + first cell started the remote shell %d times, want 1 (one backend command, one login shell)", spawn)
		}
	})
	t.Run("execute", func(t *testing.T) {
		r := stNewRig(t, srv, u, true, nil)
		before := startups()
		rtExec(t, r.eng, engine.Request{Owner: "rc", Code: "x = 1"})
		waitCompiles(t, r.c, 1)
		if d := startups() - before - 1; d != 2 {
			t.Errorf("spawn + first cell over plain Execute started the remote shell %d times, want 2 (two commands, one login shell each)", d)
		}
		for i := range 3 {
			n := startups()
			rtExec(t, r.eng, engine.Request{Owner: "rc", Code: "x += 1"})
			if d := startups() - n; d != 1 {
				t.Fatalf("warm cell %d over plain Execute started the remote shell %d times, want 1", i, d)
			}
		}
	})
}
