package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine/runner"
)

// A runner that cannot write the tool stubs it was shipped (here: stdin
// ends before them, as when the engine dies mid-spawn) fails the spawn at
// with its reason (not the 20 s wait for READY, whose message is another),
// and nothing of the kernel is left on the host.
func TestSpawnNamesWhyTheRunnerCouldNotWriteItsStubs(t *testing.T) {
	env := backends.NewLocal(t.TempDir())
	stdin := append(append([]byte{}, runner.Source...), "abc"...)
	script := spawnScript(env.TempDir(), "kstubs", "", "", [3]int{len(runner.Source), 0, 100}, 20, false)
	res, err := env.Execute(context.Background(), script, backends.ExecOptions{Stdin: stdin, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := "KD:ERR kerneldeck_tools.py was cut short: 3 of 100 bytes"
	if !strings.Contains(res.Output, want) || res.ReturnCode == 0 {
		t.Fatalf("spawn with stubs cut short: rc %d output %q, want %q", res.ReturnCode, res.Output, want)
	}
	matches, _ := filepath.Glob(filepath.Join(env.TempDir(), "kerneldeck-*", "kstubs"))
	if len(matches) != 0 {
		t.Fatalf("the failed spawn left %v", matches)
	}
}
