package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// A caller's cell id names a cell of its own key alone. Owner "a" with
// task "b/c" and owner "a/b" with task "c" read alike as strings; the
// second, asking with the first's cell id, once got the first's result
// (the engine compared the keys' strings). Now it runs its own code in
// its own kernel, and nothing it gets says that the id is taken.
func TestACellIDIsNoWayIntoAnotherKeysCell(t *testing.T) {
	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), nil)
	ctx := context.Background()
	first, err := h.Eng.Execute(ctx, engine.Request{Owner: "a", Task: "b/c", Cell: "shared-id", Code: "print('a secret of a')", Timeout: 30 * time.Second})
	if err != nil || first.Stdout != "a secret of a\n" {
		t.Fatalf("a's cell: %v %+v", err, first)
	}
	second, err := h.Eng.Execute(ctx, engine.Request{Owner: "a/b", Task: "c", Cell: "shared-id", Code: "print('mine')", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("a/b's cell with a's id: %v; want it run like any cell (the error tells a/b that the id is taken)", err)
	}
	if second.Stdout != "mine\n" || second.Kernel == nil || second.Kernel.ID == first.Kernel.ID || second.Kernel.Reused {
		t.Fatalf("a/b's cell with a's id: %+v %+v; want its own code run in a kernel of its own", second, second.Kernel)
	}
	// Each key asking again gets its own cell's result, not run again.
	for _, c := range []struct {
		owner, task, want string
	}{{"a", "b/c", "a secret of a\n"}, {"a/b", "c", "mine\n"}} {
		again, err := h.Eng.Execute(ctx, engine.Request{Owner: c.owner, Task: c.task, Cell: "shared-id", Code: "print('ran twice')", Timeout: 30 * time.Second})
		if err != nil || again.Stdout != c.want {
			t.Errorf("%s/%s asking again: %v %+v; want %q", c.owner, c.task, err, again, c.want)
		}
	}
}
