package engine_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// A host's kernel root is learnt from the first spawn: later spawns ask no
// id(1) for the login (a fork and an exec each), and a root that went away
// in between (a cleaned /tmp) is made again, owner-only, as at the first.
func TestSpawnLearnsTheKernelRoot(t *testing.T) {
	realID, err := exec.LookPath("id")
	if err != nil {
		t.Skipf("no id: %v", err)
	}
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	script := fmt.Sprintf("#!/bin/sh\necho >>%s\nexec %s \"$@\"\n", calls, realID)
	if err := os.WriteFile(filepath.Join(dir, "id"), []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	idCalls := func() int { b, _ := os.ReadFile(calls); return strings.Count(string(b), "\n") }

	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), nil)
	first := h.Run("a", "1", 0)
	if n := idCalls(); n != 1 {
		t.Fatalf("the first spawn asked id %d times, want 1", n)
	}
	for _, owner := range []string{"b", "c"} {
		h.Run(owner, "1", 0)
	}
	if n := idCalls(); n != 1 {
		t.Errorf("three spawns asked id %d times, want 1 (the first)", n)
	}
	// The root goes (its kernels with it); the next spawn makes it again.
	for _, owner := range []string{"a", "b", "c"} {
		h.Eng.ShutdownOwner(context.Background(), owner)
	}
	root := path.Dir(first.Kernel.Dir)
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	again := h.Run("d", "1", 0)
	if path.Dir(again.Kernel.Dir) != root {
		t.Fatalf("kernel dir %s, want one in %s", again.Kernel.Dir, root)
	}
	if st, err := os.Lstat(root); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("the root made again: %v %v, want a 0700 dir", st, err)
	}
	if n := idCalls(); n != 2 {
		t.Errorf("after the root went, id asked %d times in all, want 2", n)
	}
}
