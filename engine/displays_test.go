package engine_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// systemPython puts /usr/bin/python3 first on PATH, where Debian's
// matplotlib, PIL and pandas are (a pyenv python3 on PATH lacks them).
func systemPython(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		return
	}
	dir := t.TempDir()
	if err := os.Symlink("/usr/bin/python3", filepath.Join(dir, "python3")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// The display suite on the local backend, over the stream and over plain
// Execute, and over a real sshd.
func TestDisplays(t *testing.T) {
	systemPython(t)
	t.Run("local/stream", func(t *testing.T) {
		enginetest.Displays(t, func(t *testing.T) backends.Env { return backends.NewLocal(enginetest.ShortTempDir(t)) })
	})
	t.Run("local/stream/as-made", func(t *testing.T) {
		enginetest.StreamsDisplays(t, backends.NewLocal(enginetest.ShortTempDir(t)))
	})
	t.Run("local/execute", func(t *testing.T) {
		enginetest.Displays(t, func(t *testing.T) backends.Env {
			return backends.ExecuteOnly(backends.NewLocal(enginetest.ShortTempDir(t)))
		})
	})
	t.Run("ssh", func(t *testing.T) {
		srv := sshdtest.Start(t, sshdtest.Options{})
		u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
		enginetest.Displays(t, func(t *testing.T) backends.Env { return sshEnv(t, srv, u, nil) })
		t.Run("as-made", func(t *testing.T) { enginetest.StreamsDisplays(t, sshEnv(t, srv, u, nil)) })
	})
}

// BenchmarkDisplayPNG: a warm local cell that displays a 100 KB PNG, beside
// a trivial warm cell, in one engine (issue 17's budget: at most 2 ms more).
//
//	go test ./engine -run XXX -bench DisplayPNG -benchtime 300x -count 5
func BenchmarkDisplayPNG(b *testing.B) {
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(enginetest.ShortTempDir(b))}, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rtClose(b, eng) })
	setup := "import os, zlib, struct\nclass Png:\n    def __init__(self, n):\n        self.data = b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(n)\n" +
		"    def _repr_png_(self):\n        return self.data\nimg = Png(100 << 10)"
	rtExec(b, eng, engine.Request{Owner: "bench", Code: setup})
	for _, tc := range []struct{ name, code string }{{"trivial", "1"}, {"png100k", "display(img)"}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				res := rtExec(b, eng, engine.Request{Owner: "bench", Code: tc.code})
				if tc.name == "png100k" && len(res.Displays) != 1 {
					b.Fatalf("displays: %d", len(res.Displays))
				}
			}
		})
	}
}
