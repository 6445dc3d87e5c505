package cli

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/internal/dockertest"
)

// TestBinaryDockerImage: the real binary with --backend docker-image://…
// gives each owner a persistent kernel in a container of its own, reports a
// memory bomb as out of memory, and leaves no container behind when it ends.
func TestBinaryDockerImage(t *testing.T) {
	image := dockertest.Image(t)
	bin := buildBinary(t)
	isolate(t)
	cmd := exec.Command(bin, "headless", "--backend", "docker-image://"+image+"?memory=96m")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewScanner(outPipe)
	out.Buffer(nil, 1<<20)
	call := func(id, owner, code string) map[string]any {
		t.Helper()
		line, _ := json.Marshal(map[string]any{"id": id, "op": "execute", "owner": owner, "code": code})
		in.Write(append(line, '\n'))
		if !out.Scan() {
			t.Fatalf("no answer to %s; stderr: %s", id, stderr.String())
		}
		var m map[string]any
		if err := json.Unmarshal(out.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	call("1", "alice", "x = 'alice'")
	call("2", "bob", "x = 'bob'")
	if got := dockertest.ManagedBy(t, cmd.Process.Pid); len(got) != 2 {
		t.Errorf("%d containers for two owners, want 2", len(got))
	}
	if a := call("3", "alice", "print(x)"); a["stdout"] != "alice\n" {
		t.Errorf("alice's state: %v", a)
	}
	bomb := call("4", "bob", "b = bytearray(512 << 20)")
	k, _ := bomb["kernel"].(map[string]any)
	if note, _ := k["note"].(string); !strings.Contains(note, "out of memory") {
		t.Errorf("the memory bomb: %v", bomb)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kerneldeck headless: %v; stderr: %s", err, stderr.String())
	}
	if left := dockertest.ManagedBy(t, cmd.Process.Pid); len(left) != 0 {
		t.Errorf("containers left after the binary ended: %+v", left)
	}
}
