package hosttools

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newTestWorkspace returns a workspace on a fresh temp dir.
func newTestWorkspace(t *testing.T) *Workspace {
	t.Helper()
	w, err := NewWorkspace(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// newBuiltins registers the built-in tools configured by b (its Workspace
// defaults to a fresh one) and returns the registry.
func newBuiltins(t *testing.T, b *Builtins) *Registry {
	t.Helper()
	if b.Workspace == nil {
		b.Workspace = newTestWorkspace(t)
	}
	r := NewRegistry()
	if err := b.Register(r); err != nil {
		t.Fatal(err)
	}
	return r
}

// rawArgs marshals each value to JSON; a json.RawMessage value is used as is.
func rawArgs(t *testing.T, args map[string]any) Args {
	t.Helper()
	out := make(Args, len(args))
	for k, v := range args {
		if raw, ok := v.(json.RawMessage); ok {
			out[k] = raw
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = b
	}
	return out
}

// dispatch runs one call with a hang guard: no test may wait forever on a
// broken kill or pipe.
func dispatch(t *testing.T, r *Registry, tool string, args map[string]any) (Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type out struct {
		res Result
		err error
	}
	done := make(chan out, 1)
	call := Call{Owner: "alice", KernelID: "k1", Tool: tool, Args: rawArgs(t, args)}
	go func() {
		res, err := r.Dispatch(ctx, call)
		done <- out{res, err}
	}()
	select {
	case o := <-done:
		return o.res, o.err
	case <-time.After(90 * time.Second):
		t.Fatalf("%s did not return (hang guard)", tool)
		return Result{}, nil
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func mustContain(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s = %q\n\twant it to contain %q", what, got, w)
		}
	}
}

// noTempFiles fails if a write left a temporary file in dir.
func noTempFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), "tmp") {
			t.Errorf("temporary file %s left in %s", e.Name(), dir)
		}
	}
}
