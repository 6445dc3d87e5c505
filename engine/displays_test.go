package engine_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
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
	t.Run("local/execute", func(t *testing.T) {
		enginetest.Displays(t, func(t *testing.T) backends.Env {
			return backends.ExecuteOnly(backends.NewLocal(enginetest.ShortTempDir(t)))
		})
	})
	t.Run("ssh", func(t *testing.T) {
		srv := sshdtest.Start(t, sshdtest.Options{})
		u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
		enginetest.Displays(t, func(t *testing.T) backends.Env { return sshEnv(t, srv, u, nil) })
	})
}
