package engine_test

import (
	"os"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// Benchmarks over a real OpenSSH sshd on loopback, with real python3
// runners. Each reports the latency of one call as "p50-ms" and "p90-ms".
// The targets on the 2-core dev machine: a warm trivial cell p50
// <= 5 ms for a user with a light shell and <= 10 ms for a user whose shell
// rc costs 100+ ms; spawn to first result <= 200 ms. BenchmarkSSHExecFloor
// is the raw x/crypto/ssh exec of `true` on an open connection, for scale
// (about 3 ms light, 125 ms for root's shell on the dev machine).
//
//	go test -run XXX -bench SSH -benchtime 100x -count 3 ./engine/

// sbUsers are the remote users: light is a plain created user, heavy one
// whose ~/.bashrc sleeps 0.2 s for every shell sshd starts.
var sbUsers = []struct {
	name, user string
	opts       sshdtest.UserOptions
}{
	{"light", "kdtest1", sshdtest.UserOptions{}},
	{"heavy", stHeavyUser, sshdtest.UserOptions{BashrcSleep: stHeavySleep}},
}

// sbEnv is sshEnv for benchmarks: the ssh backend for u through an ssh
// config alias, with a short private temp dir owned by u.
func sbEnv(tb testing.TB, srv *sshdtest.Server, u *sshdtest.User) *backends.SSH {
	tb.Helper()
	tmp := enginetest.ShortTempDir(tb)
	if err := os.Chown(tmp, u.UID, u.GID); err != nil {
		tb.Fatal(err)
	}
	env, err := backends.NewSSH("ssh://kdbox", backends.Options{SSHConfig: srv.WriteSSHConfig(tb, "kdbox", u), SSHTempDir: tmp})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { env.Close() })
	return env
}

// sbEngine starts an engine on u's ssh backend (fast path hidden when
// executeOnly); the engine is closed before the backend.
func sbEngine(b *testing.B, srv *sshdtest.Server, u *sshdtest.User, executeOnly bool) *engine.Engine {
	b.Helper()
	var env backends.Env = sbEnv(b, srv, u)
	if executeOnly {
		env = backends.ExecuteOnly(env)
	}
	if (backends.StreamsOf(env) == nil) != executeOnly {
		b.Fatalf("ssh backend streams: got %v, want %v", backends.StreamsOf(env) != nil, !executeOnly)
	}
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rtClose(b, eng) })
	return eng
}

// sbUser makes the sbUsers entry called name able to log in to srv.
func sbUser(b *testing.B, srv *sshdtest.Server, name string) *sshdtest.User {
	b.Helper()
	for _, su := range sbUsers {
		if su.name == name {
			return srv.User(b, su.user, su.opts)
		}
	}
	b.Fatalf("no bench user %q", name)
	return nil
}

// BenchmarkSSHWarmCell: a warm trivial cell on the fast path (one frame on
// a kept direct-streamlocal channel), for a light and a heavy remote shell.
func BenchmarkSSHWarmCell(b *testing.B) {
	srv := sshdtest.Start(b, sshdtest.Options{})
	for _, su := range sbUsers {
		u := sbUser(b, srv, su.name)
		b.Run(su.name, func(b *testing.B) { sbWarm(b, sbEngine(b, srv, u, false)) })
	}
}

// BenchmarkSSHWarmCellExecute: a warm trivial cell over plain Execute (one
// session exec per cell).
func BenchmarkSSHWarmCellExecute(b *testing.B) {
	srv := sshdtest.Start(b, sshdtest.Options{})
	u := sbUser(b, srv, "light")
	b.Run("light", func(b *testing.B) { sbWarm(b, sbEngine(b, srv, u, true)) })
}

// BenchmarkSSHColdStart: spawn to first result for a new kernel on the fast
// path (a new owner each iteration; the previous kernel is shut down outside
// the measurement). One warm-up spawn first opens the shared connection and
// lets the engine learn the interpreter path, as a running dashboard has.
func BenchmarkSSHColdStart(b *testing.B) {
	srv := sshdtest.Start(b, sshdtest.Options{})
	u := sbUser(b, srv, "light")
	b.Run("light", func(b *testing.B) {
		sbCold(b, sbEngine(b, srv, u, false))
	})
}

// BenchmarkSSHExecFloor: the raw floor of one command over ssh, a session
// exec of `true` on an already open x/crypto/ssh client. sshd runs the
// user's login shell (and so its rc file) for every exec.
func BenchmarkSSHExecFloor(b *testing.B) {
	srv := sshdtest.Start(b, sshdtest.Options{})
	for _, su := range sbUsers {
		u := sbUser(b, srv, su.name)
		b.Run(su.name, func(b *testing.B) {
			client := srv.Dial(b, u)
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				sess, err := client.NewSession()
				if err != nil {
					b.Fatal(err)
				}
				err = sess.Run("true")
				sess.Close()
				lat = append(lat, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
			}
			rtReportPercentiles(b, lat)
		})
	}
}
