package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// requireLockedOut runs, as user on attacker (a host shared with the
// kernel's), every attempt to reach the kernel at dir and pid: list, read,
// write, signal, connect. Each must fail.
func requireLockedOut(t *testing.T, attacker backends.Env, user, dir string, pid int) {
	t.Helper()
	attack := fmt.Sprintf(`ls %[1]s >/dev/null 2>&1 && echo LISTED
cat %[1]s/runner.py >/dev/null 2>&1 && echo READ
touch %[1]s/planted 2>/dev/null && echo WROTE
kill -0 %[2]d 2>/dev/null && echo SIGNALLED
cat /proc/%[2]d/environ >/dev/null 2>&1 && echo ENVIRON
python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("CONNECTED")' %[1]s/sock 2>/dev/null
id -un`, dir, pid)
	out, err := attacker.Execute(context.Background(), attack, backends.ExecOptions{Timeout: 20 * time.Second})
	if err != nil || !strings.HasSuffix(strings.TrimSpace(out.Output), user) {
		t.Fatalf("the attack did not run as %s: %q %v", user, out.Output, err)
	}
	for _, w := range []string{"LISTED", "READ", "WROTE", "SIGNALLED", "ENVIRON", "CONNECTED"} {
		if strings.Contains(out.Output, w) {
			t.Errorf("%s %s the kernel:\n%s", user, strings.ToLower(w), out.Output)
		}
	}
}

// requireSecretHidden fails if the kernel's secret is in a command the
// engine ran (an exec's arguments) or in an event.
func requireSecretHidden(t *testing.T, c backendtest.Counting, h *enginetest.Harness, token string) {
	t.Helper()
	if len(token) < 32 {
		t.Fatal("the engine lists no secret for the kernel")
	}
	for _, cmd := range c.Commands() {
		if strings.Contains(cmd, token) {
			t.Fatalf("the secret is in a command (an exec's arguments): %.200s", cmd)
		}
	}
	for _, ev := range h.AllEvents() {
		if strings.Contains(fmt.Sprintf("%+v", ev), token) {
			t.Fatalf("the secret is in an event: %+v", ev)
		}
	}
}
