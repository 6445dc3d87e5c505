package runner

import (
	"bufio"
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

// The runner reads its engine connection in chunks of RECV_CHUNK: a frame
// is run whole however the writes cut it (a line longer than a chunk, a
// newline alone, the end of one frame and the start of the next in one
// write), and several frames in one read are each run, in order.
func TestRunnerReadsFramesHoweverTheyArrive(t *testing.T) {
	secret := strings.Repeat("ab", 32)
	line, _, kd := startShipped(t, shipment{script: Source}, `{"secret": "`+secret+`", "idle_exit": 60}`+"\n")
	if !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready FIFO: %q, want READY ...", line)
	}
	c, br := dialAuthed(t, kd, secret)
	frame := func(id, code string) []byte {
		b, _ := json.Marshal(map[string]any{"op": "cell", "id": id, "code": code, "timeout": 30})
		return append(b, '\n')
	}
	result := func(id, stdout string) {
		t.Helper()
		for {
			l, err := br.ReadBytes('\n')
			if err != nil {
				t.Fatalf("waiting for cell %s: %v", id, err)
			}
			var f struct{ Op, ID, Status, Stdout, Traceback string }
			if err := json.Unmarshal(l, &f); err != nil {
				t.Fatalf("frame %.200q: %v", l, err)
			}
			if f.Op != "result" {
				continue
			}
			if f.ID != id || f.Status != "ok" || f.Stdout != stdout {
				t.Fatalf("result of cell %s: %s, stdout %q, traceback %q; want cell %s ok, %q", f.ID, f.Status, f.Stdout, f.Traceback, id, stdout)
			}
			return
		}
	}
	write := func(b []byte) {
		t.Helper()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // its own read
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))

	long := strings.Repeat("x", 300<<10)
	big := frame("big", "s = '"+long+"'\nprint(len(s))")
	for i := 0; i < len(big)-1; i += 16 << 10 {
		write(big[i:min(i+16<<10, len(big)-1)])
	}
	write([]byte("\n"))
	result("big", strconv.Itoa(len(long))+"\n")

	small, next := frame("small", "print(len(s) + 1)"), frame("next", "print(len(s) + 2)")
	write(small[:10])
	write(append(small[10:], next[:10]...))
	result("small", strconv.Itoa(len(long)+1)+"\n")
	write(next[10:])
	result("next", strconv.Itoa(len(long)+2)+"\n")

	write(append(frame("a", "n = 40"), frame("b", "print(n + 2)")...))
	result("a", "")
	result("b", "42\n")
}

// A watch can reach the runner before the cell it names (the engine sends
// it when an output subscriber comes while the cell is starting): that
// cell then streams its output to the socket; a cell the watch does not
// name does not, and the next cell ends the watch either way.
func TestRunnerWatchBeforeItsCellStreamsIt(t *testing.T) {
	secret := strings.Repeat("ab", 32)
	line, _, kd := startShipped(t, shipment{script: Source}, `{"secret": "`+secret+`", "idle_exit": 60}`+"\n")
	if !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready FIFO: %q, want READY ...", line)
	}
	c, br := dialAuthed(t, kd, secret)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	send := func(v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := c.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	// outputs returns what cell id streamed before its result.
	outputs := func(id string) string {
		t.Helper()
		var got strings.Builder
		for {
			l, err := br.ReadBytes('\n')
			if err != nil {
				t.Fatalf("waiting for cell %s: %v", id, err)
			}
			var f struct{ Op, ID, Stream, Text, Status string }
			if err := json.Unmarshal(l, &f); err != nil {
				t.Fatalf("frame %.200q: %v", l, err)
			}
			switch {
			case f.Op == "output" && f.ID == id:
				got.WriteString(f.Stream + ":" + f.Text)
			case f.Op == "result" && f.ID == id:
				if f.Status != "ok" {
					t.Fatalf("cell %s: %s", id, f.Status)
				}
				return got.String()
			}
		}
	}
	for _, tc := range []struct{ watch, cell, want string }{
		{"w1", "w1", "stdout:hi\n"},
		{"w3", "w2", ""},
		{"", "w3", ""}, // a watch is kept for the next cell only
	} {
		if tc.watch != "" {
			send(map[string]string{"op": "watch", "id": tc.watch})
			time.Sleep(50 * time.Millisecond) // read on its own, before the cell
		}
		send(map[string]any{"op": "cell", "id": tc.cell, "code": "print('hi')", "stream": false, "timeout": 30})
		if got := outputs(tc.cell); got != tc.want {
			t.Errorf("watch %q, cell %s streamed %q, want %q", tc.watch, tc.cell, got, tc.want)
		}
	}
}
