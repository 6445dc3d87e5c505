package dockertest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
)

// TestImageRunsPython: the image built from this machine's files runs
// python3 and the tools the scripts need, as root and as the test users.
func TestImageRunsPython(t *testing.T) {
	name := Container(t, ContainerOptions{})
	c := Client(t)
	for _, user := range []string{"", "alice", "bob"} {
		out := run(t, c, name, user, `import os, ssl, ctypes, socket, json; print(os.getuid(), os.path.exists("/tmp"))`)
		if !strings.HasSuffix(strings.TrimSpace(out), "True") {
			t.Errorf("user %q: python3 said %q", user, out)
		}
	}
}

func run(t *testing.T, c *client.Client, name, user, code string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex, err := c.ExecCreate(ctx, name, client.ExecCreateOptions{User: user, AttachStdout: true, AttachStderr: true,
		Cmd: []string{"bash", "-c", `python3 -c "$1" && setsid --version >/dev/null && sha256sum --version >/dev/null && ps -o pid= -p $$`, "x", code}})
	if err != nil {
		t.Fatal(err)
	}
	att, err := c.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	var out, errOut bytes.Buffer
	stdcopy.StdCopy(&out, &errOut, att.Reader)
	if errOut.Len() > 0 {
		t.Errorf("user %q: stderr %q", user, errOut.String())
	}
	return strings.SplitN(out.String(), "\n", 2)[0]
}
