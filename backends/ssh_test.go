package backends_test

import (
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// newSSH opens the ssh backend for u on srv through a generated ssh config
// alias, as an operator would set it up.
func newSSH(t *testing.T, srv *sshdtest.Server, u *sshdtest.User) *backends.SSH {
	t.Helper()
	cfg := srv.WriteSSHConfig(t, "kdbox", u)
	env, err := backends.NewSSH("ssh://kdbox", backends.Options{SSHConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

func TestSSHContract(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	for _, name := range []string{"", "kdtest1"} {
		u := srv.User(t, name, sshdtest.UserOptions{})
		t.Run("user="+u.Name, func(t *testing.T) {
			backendtest.Contract(t, func(t *testing.T) backends.Env { return newSSH(t, srv, u) })
		})
	}
}
