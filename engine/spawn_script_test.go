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
	stdin := spawnStdin(runner.Source, nil, []byte("abc"), nil)
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

// A runner that dies before READY (here: runner.py that is not Python)
// ends the spawn at once with what it wrote to runner.log: its watcher
// lets go of the ready pipe, so the death is the pipe's end, not the 20 s
// wait for READY (whose message is another). Nothing is left.
func TestSpawnSaysTheRunnerExitedBeforeItWasReady(t *testing.T) {
	env := backends.NewLocal(t.TempDir())
	bad := []byte("def (\n")
	script := spawnScript(env.TempDir(), "kdied", "", "", [3]int{len(bad), 0, 0}, 20, false)
	res, err := env.Execute(context.Background(), script, backends.ExecOptions{Stdin: spawnStdin(bad, nil, nil, []byte("{}\n")), Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Output, "KD:ERR runner exited before it was ready: ") || !strings.Contains(res.Output, "SyntaxError") || res.ReturnCode == 0 {
		t.Fatalf("spawn of a runner that dies: rc %d output %q, want its exit and the SyntaxError", res.ReturnCode, res.Output)
	}
	matches, _ := filepath.Glob(filepath.Join(env.TempDir(), "kerneldeck-*", "kdied"))
	if len(matches) != 0 {
		t.Fatalf("the failed spawn left %v", matches)
	}
}
