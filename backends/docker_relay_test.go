package backends

import (
	"bufio"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The docker stream relay's acknowledgement is its first line on stdout,
// ahead of anything the socket sends at once (a runner's challenge): the
// dial reads the ack from stdout, and an ack anywhere else could come after
// bytes that wait for a reader that waits for the ack (the stall CI met when
// the ack was on stderr). Run here with this machine's python3 against a
// socket that speaks first, so the order does not depend on a daemon.
func TestRelayAcknowledgesAheadOfTheStream(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("challenge\n")) // speaks first, as a runner does
		io.Copy(c, c)                  // then echoes
	}()

	for _, tc := range []struct{ name, path, want string }{
		{"open", sock, "KDRELAY OK"},
		{"missing", sock + ".missing", "KDRELAY ERR "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("python3", "-I", "-S", "-c", relaySource, tc.path)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
			lines := make(chan string, 4)
			go func() {
				br := bufio.NewReader(stdout)
				for {
					l, err := br.ReadString('\n')
					if err != nil {
						close(lines)
						return
					}
					lines <- strings.TrimSuffix(l, "\n")
				}
			}()
			next := func() string {
				select {
				case l, ok := <-lines:
					if !ok {
						return "(stdout ended)"
					}
					return l
				case <-time.After(10 * time.Second):
					return "(nothing within 10 s)"
				}
			}
			if got := next(); !strings.HasPrefix(got, tc.want) {
				t.Fatalf("the relay's first stdout line is %q, want %q... (stderr %q)", got, tc.want, stderr.String())
			}
			if tc.want != "KDRELAY OK" {
				return
			}
			if got := next(); got != "challenge" {
				t.Fatalf("after the ack: %q, want the socket's first line", got)
			}
			stdin.Write([]byte("ping\n"))
			if got := next(); got != "ping" {
				t.Fatalf("the stream both ways: %q, want the echo of ping", got)
			}
		})
	}
}
