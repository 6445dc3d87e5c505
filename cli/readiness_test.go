package cli

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serve tells a supervisor when its socket takes connections, on the
// descriptor --ready-fd names and to systemd's NOTIFY_SOCKET, and that it
// stops; neither reaches a kernel.
func TestServeSaysWhenItIsReady(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	sock := filepath.Join(filepath.Dir(dirs.state), "run", "engine.sock")
	notifyPath := filepath.Join(t.TempDir(), "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var st syscall.Stat_t
	syscall.Fstat(int(w.Fd()), &st)
	pipeName := fmt.Sprintf("pipe:[%d]", st.Ino)

	cmd := exec.Command(bin, "serve", "--listen", sock, "--state-dir", dirs.state, "--ready-fd", "3")
	cmd.Env = append(dirs.env(), "NOTIFY_SOCKET="+notifyPath)
	cmd.ExtraFiles = []*os.File{w}
	var errOut syncBuffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	termed := false
	defer func() {
		// One SIGTERM: serve then kills its kernels; a second would end
		// it at once and leave them.
		if !termed {
			cmd.Process.Signal(syscall.SIGTERM)
		}
		cmd.Wait()
	}()
	r.SetReadDeadline(time.Now().Add(tmuxWait))
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || line != "READY "+sock+"\n" {
		t.Fatalf("--ready-fd said %q (%v), want READY and the socket\nstderr: %s", line, err, errOut.String())
	}
	// Ready means ready: the socket takes a connection now.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("told ready, but the socket refuses: %v", err)
	}
	c.Close()
	notify.SetReadDeadline(time.Now().Add(tmuxWait))
	buf := make([]byte, 4096)
	n, err := notify.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1\nSTATUS=serving at "+sock {
		t.Fatalf("NOTIFY_SOCKET got %q (%v)", buf[:n], err)
	}

	// A kernel (the spare started before ready, here) holds neither.
	a := startAgent(t, bin, dirs.env(), "--connect", sock)
	a.send(map[string]any{"id": "1", "op": "execute", "owner": "o", "code": "import os\n" +
		"print(os.environ.get('NOTIFY_SOCKET'))\n" +
		"print(sorted(os.readlink('/proc/self/fd/' + f) for f in os.listdir('/proc/self/fd') if os.path.exists('/proc/self/fd/' + f)))"})
	res := a.answer("1")
	if out, _ := res["stdout"].(string); !strings.HasPrefix(out, "None\n") || strings.Contains(out, pipeName) {
		t.Fatalf("a kernel sees the supervisor's socket or descriptor (%s): %v", pipeName, res)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	termed = true
	n, err = notify.Read(buf)
	if err != nil || string(buf[:n]) != "STOPPING=1" {
		t.Fatalf("NOTIFY_SOCKET got %q (%v) at SIGTERM, want STOPPING=1", buf[:n], err)
	}
}

// A --ready-fd that is not open is refused before anything starts.
func TestServeRefusesAClosedReadyFD(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	cmd := exec.Command(bin, "serve", "--listen", filepath.Join(t.TempDir(), "s.sock"), "--state-dir", dirs.state, "--ready-fd", "9")
	cmd.Env = dirs.env()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), "--ready-fd 9: not an open file descriptor") {
		t.Fatalf("serve --ready-fd 9 (closed): %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dirs.state, "events")); err == nil {
		t.Errorf("the engine started before the flag was checked")
	}
}
