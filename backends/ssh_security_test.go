package backends_test

// Security and robustness of the ssh backend against a real OpenSSH sshd:
// host keys, authentication, ssh config resolution, timeouts and re-dials.
// No mocks: every test talks to /usr/sbin/sshd (internal/sshdtest), a real
// ssh-agent, or a real TCP listener.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// hangGuard bounds every call that must not hang. It is a guard against a
// stuck test, not a speed assertion.
const hangGuard = 20 * time.Second

// guarded runs f in a goroutine and fails the test if it has not returned
// within hangGuard.
func guarded[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangGuard):
		t.Fatalf("%s did not return within %v: it hangs", what, hangGuard)
		panic("unreachable")
	}
}

type execOut struct {
	res backends.Result
	err error
}

// try runs command under the hang guard and returns what Execute returned.
// The context has no deadline of its own, so whatever bounds the call is
// the backend's own timeouts.
func try(t *testing.T, env backends.Env, command string) (backends.Result, error) {
	t.Helper()
	return tryCtx(t, context.Background(), env, command, backends.ExecOptions{})
}

func tryCtx(t *testing.T, ctx context.Context, env backends.Env, command string, opts backends.ExecOptions) (backends.Result, error) {
	t.Helper()
	r := guarded(t, fmt.Sprintf("Execute(%q) on %s", command, env.URI()), func() execOut {
		res, err := env.Execute(ctx, command, opts)
		return execOut{res, err}
	})
	return r.res, r.err
}

// mustRun runs command and returns its trimmed output, failing the test on a
// transport error or a non-zero return code.
func mustRun(t *testing.T, env backends.Env, command string) string {
	t.Helper()
	res, err := try(t, env, command)
	if err != nil {
		t.Fatalf("Execute(%q) on %s: %v", command, env.URI(), err)
	}
	if res.ReturnCode != 0 {
		t.Fatalf("Execute(%q) on %s: rc %d, output %q", command, env.URI(), res.ReturnCode, res.Output)
	}
	return strings.TrimSpace(res.Output)
}

// openSSH builds an ssh backend and closes it at the end of the test.
func openSSH(t *testing.T, uri string, opts backends.Options) *backends.SSH {
	t.Helper()
	env, err := backends.NewSSH(uri, opts)
	if err != nil {
		t.Fatalf("NewSSH(%q): %v", uri, err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// writeFile writes data to a new file name in the test's temp dir.
func writeFile(t *testing.T, name, data string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// emptyConfig is an ssh config with nothing in it, so that the real
// ~/.ssh/config of whoever runs the tests plays no part.
func emptyConfig(t *testing.T) string {
	t.Helper()
	return writeFile(t, "ssh_config", "# empty\n", 0o600)
}

// configWithKnownHosts is srv.SSHConfig with UserKnownHostsFile pointing at kh.
func configWithKnownHosts(t *testing.T, srv *sshdtest.Server, alias string, u *sshdtest.User, kh string) string {
	t.Helper()
	text := srv.SSHConfig(alias, u)
	if !strings.Contains(text, srv.KnownHostsFile()) {
		t.Fatalf("generated ssh config does not name %s:\n%s", srv.KnownHostsFile(), text)
	}
	return writeFile(t, "ssh_config", strings.Replace(text, srv.KnownHostsFile(), kh, 1), 0o600)
}

// newKeyFile writes a fresh ed25519 private key (OpenSSH format, 0600) that
// no server knows.
func newKeyFile(t *testing.T) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "id_stranger", string(pem.EncodeToMemory(block)), 0o600)
}

// statFile returns the content and permission bits of p ("" and 0 when p
// does not exist).
func statFile(t *testing.T, p string) (string, os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return "", 0
	}
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data), st.Mode().Perm()
}

// logins counts the successful public-key logins in the sshd log.
func logins(srv *sshdtest.Server) int { return strings.Count(srv.Log(), "Accepted publickey for ") }

// requireRefused checks that a call that had to be refused before anything
// ran on the host was: it returned an error, the marker command never ran
// and nobody logged in.
func requireRefused(t *testing.T, srv *sshdtest.Server, err error, marker string, loginsBefore int) {
	t.Helper()
	if err == nil {
		t.Fatal("the connection was not refused")
	}
	if _, statErr := os.Stat(marker); statErr == nil {
		t.Fatalf("the command ran on the host although the connection was refused (%s exists)", marker)
	}
	if n := logins(srv); n != loginsBefore {
		t.Fatalf("sshd accepted a login (%d logins, %d before) although the host key was refused", n, loginsBefore)
	}
}

// ---- host keys -------------------------------------------------------------

// An unknown host (known_hosts absent or empty) is refused before anything
// runs, with a message that shows the key's fingerprint and says how to
// accept it; known_hosts is left as it was. Uses the --known-hosts override
// (Options.SSHKnownHosts) over the config's UserKnownHostsFile.
func TestSSHHostKeyUnknownIsRefused(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	fp := ssh.FingerprintSHA256(srv.HostKey(sshdtest.ED25519))
	for _, absent := range []bool{true, false} {
		name := map[bool]string{true: "absent", false: "empty"}[absent]
		t.Run("known_hosts="+name, func(t *testing.T) {
			dir := t.TempDir()
			kh := filepath.Join(dir, "known_hosts")
			if !absent {
				if err := os.WriteFile(kh, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: srv.WriteSSHConfig(t, "kdbox", u), SSHKnownHosts: kh})
			marker := filepath.Join(dir, "ran")
			before := logins(srv)
			_, err := try(t, env, "touch "+marker)
			requireRefused(t, srv, err, marker, before)
			for _, want := range []string{"unknown", "--accept-new-host-key", kh, fp} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not mention %q: %v", want, err)
				}
			}
			data, mode := statFile(t, kh)
			if absent && mode != 0 {
				t.Errorf("known_hosts was created although no key was accepted: %q", data)
			}
			if !absent && data != "" {
				t.Errorf("known_hosts was written although no key was accepted: %q", data)
			}
		})
	}
}

// --accept-new-host-key: the first connection records the server's key in
// the known_hosts file the ssh config names (UserKnownHostsFile), as
// "[127.0.0.1]:port <key>" with mode 0600; later connections without the
// option verify against it, and nothing is recorded twice.
func TestSSHHostKeyAcceptNewRecordsIt(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	// A first-time user: not even the directory exists yet.
	kh := filepath.Join(t.TempDir(), "dot-ssh", "known_hosts")
	cfg := configWithKnownHosts(t, srv, "kdbox", u, kh)

	first := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: cfg, AcceptNewHostKey: true})
	if got := mustRun(t, first, "id -un"); got != u.Name {
		t.Fatalf("id -un = %q, want %q", got, u.Name)
	}
	want := srv.KnownHostsLine(sshdtest.ED25519) + "\n"
	if !strings.HasPrefix(want, "[127.0.0.1]:") {
		t.Fatalf("expected line %q is not for [127.0.0.1]:port", want)
	}
	data, mode := statFile(t, kh)
	if data != want {
		t.Fatalf("known_hosts after accepting:\n%q\nwant exactly\n%q", data, want)
	}
	if mode != 0o600 {
		t.Fatalf("known_hosts has mode %v, want 0600", mode)
	}
	if st, err := os.Stat(filepath.Dir(kh)); err != nil || st.Mode().Perm()&0o077 != 0 {
		t.Fatalf("the directory created for known_hosts is open to others: %v %v", st.Mode(), err)
	}
	cb, err := knownhosts.New(kh)
	if err != nil {
		t.Fatal(err)
	}
	if err := cb(srv.Addr(), &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: srv.Port()}, srv.HostKey(sshdtest.ED25519)); err != nil {
		t.Fatalf("the recorded line does not verify the server's key: %v", err)
	}

	second := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: cfg})
	if got := mustRun(t, second, "id -un"); got != u.Name {
		t.Fatalf("second backend without accept-new: id -un = %q", got)
	}
	third := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: cfg, AcceptNewHostKey: true})
	mustRun(t, third, "true")
	if again, _ := statFile(t, kh); again != want {
		t.Fatalf("known_hosts changed after connecting to a known host:\n%q", again)
	}
}

// A changed host key (known_hosts holds another key of the same type for
// [127.0.0.1]:port) is refused, with or without --accept-new-host-key,
// loudly, before anything runs, and known_hosts is not modified.
func TestSSHHostKeyChangedIsRefused(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	_, impostor, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(impostor)
	if err != nil {
		t.Fatal(err)
	}
	oldLine := knownhosts.Line([]string{srv.Addr()}, signer.PublicKey()) + "\n"
	for _, accept := range []bool{true, false} {
		t.Run(fmt.Sprintf("accept-new=%v", accept), func(t *testing.T) {
			kh := writeFile(t, "known_hosts", oldLine, 0o600)
			env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: srv.WriteSSHConfig(t, "kdbox", u),
				SSHKnownHosts: kh, AcceptNewHostKey: accept})
			marker := filepath.Join(t.TempDir(), "ran")
			before := logins(srv)
			_, err := try(t, env, "touch "+marker)
			requireRefused(t, srv, err, marker, before)
			for _, want := range []string{"CHANGED", kh, "ssh-keygen -R"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not mention %q: %v", want, err)
				}
			}
			if data, mode := statFile(t, kh); data != oldLine || mode != 0o600 {
				t.Fatalf("known_hosts was modified (mode %v):\n%q", mode, data)
			}
			// Still refused on the next try: the refusal is not a one-off.
			_, err = try(t, env, "touch "+marker)
			requireRefused(t, srv, err, marker, before)
		})
	}
}

// golang/go#29286: a server with ed25519, rsa and ecdsa host keys, and a
// known_hosts holding only one of them. The backend must ask the server for
// the algorithm on file, instead of accepting whatever the server offers
// first and calling it a changed key.
func TestSSHHostKeyAlgorithmOnFileIsNegotiated(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{HostKeyTypes: []sshdtest.KeyType{sshdtest.ED25519, sshdtest.RSA, sshdtest.ECDSA}})
	u := srv.User(t, "", sshdtest.UserOptions{})
	for _, typ := range []sshdtest.KeyType{sshdtest.RSA, sshdtest.ECDSA, sshdtest.ED25519} {
		t.Run("only-"+string(typ), func(t *testing.T) {
			kh := filepath.Join(t.TempDir(), "known_hosts")
			if err := srv.WriteKnownHosts(kh, typ); err != nil {
				t.Fatal(err)
			}
			before, _ := statFile(t, kh)
			env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: srv.WriteSSHConfig(t, "kdbox", u), SSHKnownHosts: kh})
			if got := mustRun(t, env, "id -un"); got != u.Name {
				t.Fatalf("id -un = %q", got)
			}
			if after, _ := statFile(t, kh); after != before {
				t.Fatalf("known_hosts changed:\n%q", after)
			}
		})
	}
}

// ---- authentication --------------------------------------------------------

// startAgent runs a real ssh-agent in the foreground on a short socket path
// and stops it at the end of the test.
func startAgent(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("ssh-agent"); err != nil {
		t.Skip("ssh-agent not installed: apt-get install openssh-client")
	}
	dir, err := os.MkdirTemp("", "kdag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.Command("ssh-agent", "-D", "-a", sock)
	// Its stdout (the shell snippet to export SSH_AUTH_SOCK) is not needed.
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock
		}
		if time.Now().After(end) {
			t.Fatalf("ssh-agent did not listen on %s", sock)
		}
	}
}

// agentAdd loads key into the agent at sock with the real ssh-add.
func agentAdd(t *testing.T, sock, key string) {
	t.Helper()
	cmd := exec.Command("ssh-add", key)
	cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ssh-add %s: %v: %s", key, err, out)
	}
}

// encryptedCopy returns a passphrase-protected copy of key, encrypted by
// the real ssh-keygen.
func encryptedCopy(t *testing.T, key string) string {
	t.Helper()
	data, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	enc := writeFile(t, "id_encrypted", string(data), 0o600)
	if out, err := exec.Command("ssh-keygen", "-q", "-p", "-P", "", "-N", "correct horse battery", "-f", enc).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -p: %v: %s", err, out)
	}
	if _, err := ssh.ParsePrivateKey(mustRead(t, enc)); err == nil {
		t.Fatal("the copy is not encrypted")
	}
	return enc
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// An encrypted identity file is never prompted for: as the only key it is a
// clear error that says it is encrypted and how to use it (ssh-add), and it
// comes back instead of hanging. With an agent running that does not hold
// the key, the error still says so.
func TestSSHEncryptedIdentityIsAClearError(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	enc := encryptedCopy(t, u.KeyFile)
	cfg := writeFile(t, "ssh_config", strings.Replace(srv.SSHConfig("kdbox", u), u.KeyFile, enc, 1), 0o600)
	check := func(t *testing.T) {
		env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: cfg})
		_, err := try(t, env, "true")
		if err == nil {
			t.Fatal("connected with an encrypted key nobody unlocked")
		}
		for _, want := range []string{"encrypted", "ssh-add", enc} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the error does not mention %q: %v", want, err)
			}
		}
	}
	t.Run("no-agent", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", "")
		check(t)
	})
	t.Run("agent-without-the-key", func(t *testing.T) {
		sock := startAgent(t)
		agentAdd(t, sock, newKeyFile(t))
		t.Setenv("SSH_AUTH_SOCK", sock)
		// The config says IdentitiesOnly yes, so the agent is not asked:
		// the encrypted file is still the only key.
		check(t)
	})
	t.Run("key-in-agent", func(t *testing.T) {
		// The remedy the error suggests works: ssh-add the key (its
		// unencrypted twin here; ssh-add would ask for the passphrase)
		// and drop IdentitiesOnly.
		sock := startAgent(t)
		agentAdd(t, sock, u.KeyFile)
		t.Setenv("SSH_AUTH_SOCK", sock)
		text := strings.Replace(srv.SSHConfig("kdbox", u), u.KeyFile, enc, 1)
		text = strings.Replace(text, "IdentitiesOnly yes", "IdentitiesOnly no", 1)
		env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: writeFile(t, "ssh_config", text, 0o600)})
		if got := mustRun(t, env, "id -un"); got != u.Name {
			t.Fatalf("id -un = %q", got)
		}
	})
}

// A missing identity file given by --identity (Options.SSHIdentity) is a
// clear error naming the file, with or without an agent that holds some
// other key.
func TestSSHMissingIdentityIsAClearError(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	missing := filepath.Join(t.TempDir(), "no_such_key")
	check := func(t *testing.T) {
		env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: srv.WriteSSHConfig(t, "kdbox", u), SSHIdentity: missing})
		before := logins(srv)
		_, err := try(t, env, "true")
		if err == nil {
			t.Fatal("connected although the given identity file does not exist")
		}
		if logins(srv) != before {
			t.Fatal("sshd accepted a login")
		}
		for _, want := range []string{missing, "no such file"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the error does not mention %q: %v", want, err)
			}
		}
	}
	t.Run("no-agent", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", "")
		check(t)
	})
	t.Run("agent-with-another-key", func(t *testing.T) {
		sock := startAgent(t)
		agentAdd(t, sock, newKeyFile(t))
		t.Setenv("SSH_AUTH_SOCK", sock)
		// Without IdentitiesOnly the agent's key is offered too, and
		// refused: the operator must still learn that --identity is wrong.
		text := strings.Replace(srv.SSHConfig("kdbox", u), "IdentitiesOnly yes", "IdentitiesOnly no", 1)
		env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: writeFile(t, "ssh_config", text, 0o600), SSHIdentity: missing})
		_, err := try(t, env, "true")
		if err == nil {
			t.Fatal("connected with neither the missing key nor an authorized agent key")
		}
		if !strings.Contains(err.Error(), missing) {
			t.Errorf("the error does not name the missing identity file %s: %v", missing, err)
		}
	})
}

// ssh-agent: a real agent holding the user's key, a config without
// IdentityFile or IdentitiesOnly: the connection uses the agent (without
// the agent the same config cannot log in). With IdentitiesOnly yes and a
// wrong IdentityFile, the agent is not used and authentication fails.
func TestSSHAgent(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	sock := startAgent(t)
	agentAdd(t, sock, u.KeyFile)
	plain := fmt.Sprintf("Host kdbox\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  UserKnownHostsFile %s\n",
		srv.Port(), u.Name, srv.KnownHostsFile())
	cfg := writeFile(t, "ssh_config", plain, 0o600)

	t.Run("agent-logs-in", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", sock)
		env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: cfg})
		if got := mustRun(t, env, "id -un"); got != u.Name {
			t.Fatalf("id -un = %q", got)
		}
	})
	t.Run("same-config-without-agent-fails", func(t *testing.T) {
		// The control: the login above was the agent's doing, not some
		// default identity file's.
		t.Setenv("SSH_AUTH_SOCK", "")
		env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: cfg})
		if _, err := try(t, env, "true"); err == nil {
			t.Fatal("logged in without the agent: the agent test proves nothing")
		}
	})
	t.Run("identities-only-ignores-agent", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", sock)
		wrong := newKeyFile(t)
		text := plain + fmt.Sprintf("  IdentityFile %s\n  IdentitiesOnly yes\n", wrong)
		env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: writeFile(t, "ssh_config", text, 0o600)})
		before := logins(srv)
		_, err := try(t, env, "true")
		if err == nil {
			t.Fatal("logged in with IdentitiesOnly yes and a wrong IdentityFile: the agent was used")
		}
		if logins(srv) != before {
			t.Fatal("sshd accepted a login")
		}
		if !strings.Contains(err.Error(), "unable to authenticate") {
			t.Errorf("expected an authentication failure, got: %v", err)
		}
	})
}

// ---- ssh config resolution -------------------------------------------------

// The explicit form ssh://user@127.0.0.1:PORT with --identity and
// --known-hosts: values in the URI and the overrides win over a config that
// says otherwise for that host.
func TestSSHExplicitURIWithOverrides(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	t.Setenv("SSH_AUTH_SOCK", "")
	misleading := writeFile(t, "ssh_config", "Host 127.0.0.1\n  User kdnobody\n  Port 1\n  IdentityFile "+newKeyFile(t)+
		"\n  IdentitiesOnly yes\n  UserKnownHostsFile "+filepath.Join(t.TempDir(), "empty_known_hosts")+"\n", 0o600)
	for _, cfg := range []string{emptyConfig(t), misleading} {
		uri := fmt.Sprintf("ssh://%s@127.0.0.1:%d", u.Name, srv.Port())
		env, err := backends.Open(uri, backends.Options{SSHConfig: cfg, SSHIdentity: u.KeyFile, SSHKnownHosts: srv.KnownHostsFile()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.(*backends.SSH).Close() })
		if env.URI() != uri {
			t.Errorf("URI() = %q, want %q", env.URI(), uri)
		}
		if got := mustRun(t, env, "id -un"); got != u.Name {
			t.Fatalf("id -un = %q", got)
		}
	}
}

// ProxyJump, one hop: Host target goes through Host jumpalias, the same
// sshd as another user. Commands run as the target user, and the jump
// connection really exists (an authenticated login of the jump user).
func TestSSHProxyJumpOneHop(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	target := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	jump := srv.User(t, "kdtest2", sshdtest.UserOptions{})
	cfg := writeFile(t, "ssh_config", srv.SSHConfig("jumpalias", jump)+srv.SSHConfig("target", target, "ProxyJump jumpalias"), 0o600)
	env := openSSH(t, "ssh://target", backends.Options{SSHConfig: cfg})
	if got := mustRun(t, env, "id -un"); got != target.Name {
		t.Fatalf("id -un = %q, want %s", got, target.Name)
	}
	if n := len(srv.SessionPIDs(jump.Name)); n != 1 {
		t.Fatalf("%d connections of the jump user %s, want 1: the hop was not used", n, jump.Name)
	}
	// The tunnelled connection carries everything, the fast path included.
	if got := mustRun(t, env, "echo $SSH_CONNECTION"); got == "" {
		t.Fatal("no SSH_CONNECTION through the jump host")
	}
}

// Two hops are refused with a clear message, whether written as a list or
// as a jump host that has a ProxyJump of its own; nothing connects.
func TestSSHProxyJumpTwoHopsIsRefused(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	cfg := writeFile(t, "ssh_config", srv.SSHConfig("hop1", u)+srv.SSHConfig("hop2", u, "ProxyJump hop1")+
		srv.SSHConfig("chained", u, "ProxyJump hop2")+srv.SSHConfig("listed", u, "ProxyJump hop1,hop2"), 0o600)
	for _, tc := range []struct{ alias, mention string }{{"chained", "hop2"}, {"listed", "hop1,hop2"}} {
		t.Run(tc.alias, func(t *testing.T) {
			env, err := backends.NewSSH("ssh://"+tc.alias, backends.Options{SSHConfig: cfg})
			if err == nil {
				t.Cleanup(func() { env.Close() })
				_, err = try(t, env, "true")
			}
			if err == nil {
				t.Fatal("a two-hop ProxyJump was accepted")
			}
			for _, want := range []string{"supports one", tc.mention} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not mention %q: %v", want, err)
				}
			}
		})
	}
	if n := logins(srv); n != 0 {
		t.Fatalf("%d logins happened for refused configs", n)
	}
}

// Bad URIs are refused by Open with an error that quotes the URI and names
// the problem; a password in a URI is not echoed back into logs.
func TestSSHBadURIs(t *testing.T) {
	cfg := emptyConfig(t)
	const secret = "hunter2-in-the-uri"
	form := "ssh://[user@]host[:port]"
	for _, tc := range []struct {
		uri  string
		want []string
	}{
		{"ssh://", []string{form}},
		{"ssh://h:0", []string{"port", "1 to 65535"}},
		{"ssh://h:65536", []string{"port", "1 to 65535"}},
		{"ssh://h:port", []string{"ssh://h:port"}},
		{"ssh://u:" + secret + "@h", []string{"password"}},
		{"ssh://h/path", []string{form}},
		{"ssh://h?x=1", []string{form}},
	} {
		t.Run(tc.uri, func(t *testing.T) {
			env, err := backends.Open(tc.uri, backends.Options{SSHConfig: cfg})
			if err == nil {
				env.(*backends.SSH).Close()
				t.Fatalf("Open(%q) accepted a bad URI", tc.uri)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Open(%q): error does not mention %q: %v", tc.uri, want, err)
				}
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Open(%q): the error repeats the password (it would end up in logs): %v", tc.uri, err)
			}
		})
	}
}

// An ssh config that is not a small regular file is refused with what it
// is, instead of read forever (/dev/zero, a FIFO nobody writes to).
func TestSSHConfigThatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("# padding\n"), 500_000), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{"/dev/zero", "is a device, not a regular file"},
		{fifo, "is a named pipe, not a regular file"},
		{dir, "is a directory, not a regular file"},
		{big, "over the 4194304-byte limit"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		done := make(chan error, 1)
		go func() {
			env, err := backends.Open("ssh://kdbox", backends.Options{SSHConfig: tc.path})
			if err == nil {
				env.(*backends.SSH).Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path) {
				t.Errorf("ssh config %s: %v; want an error naming it and saying %q", tc.path, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("ssh config %s: Open did not return (reading it forever?)", tc.path)
		}
	}
}

// ---- timeouts ----------------------------------------------------------------

// silentServer listens on 127.0.0.1, accepts connections and holds them
// open without ever sending a byte (a host whose sshd is wedged). Each
// accepted connection is announced on the returned channel.
func silentServer(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{}, 64)
	var mu sync.Mutex
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	return l.Addr().String(), ch
}

func silentBackend(t *testing.T, addr string, dialTimeout time.Duration) *backends.SSH {
	t.Helper()
	kh := writeFile(t, "known_hosts", "", 0o600)
	return openSSH(t, "ssh://kd@"+addr, backends.Options{SSHConfig: emptyConfig(t), SSHIdentity: newKeyFile(t),
		SSHKnownHosts: kh, SSHDialTimeout: dialTimeout})
}

// A host that accepts TCP but never speaks SSH: with SSHDialTimeout 1s,
// Execute returns an error naming the host instead of hanging, and so does
// the next call (a failed dial leaves nothing stuck).
func TestSSHDialTimeoutOnSilentHost(t *testing.T) {
	addr, accepted := silentServer(t)
	env := silentBackend(t, addr, time.Second)
	for i := range 2 {
		_, err := try(t, env, "true")
		if err == nil {
			t.Fatalf("call %d: Execute against a silent host succeeded", i)
		}
		if !strings.Contains(err.Error(), addr) {
			t.Errorf("call %d: the error does not name the host %s: %v", i, addr, err)
		}
		select {
		case <-accepted:
		default:
			t.Fatalf("call %d: the silent server never saw a connection; the test proves nothing", i)
		}
	}
}

// Cancelling the context while the handshake waits on a silent host (the
// dial timeout is far longer than the guard) returns promptly with an error
// that says it was cancelled; so does a second caller waiting for the same
// dial. A command Timeout also bounds the dial, as ErrTimeout.
func TestSSHDialCancellation(t *testing.T) {
	t.Run("cancel", func(t *testing.T) {
		addr, accepted := silentServer(t)
		env := silentBackend(t, addr, 10*time.Minute)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			// Cancel once the handshake is under way: the TCP connection
			// is up and the client waits for the server's banner.
			select {
			case <-accepted:
				time.Sleep(300 * time.Millisecond)
			case <-time.After(hangGuard):
			}
			cancel()
		}()
		_, err := tryCtx(t, ctx, env, "true", backends.ExecOptions{})
		if err == nil {
			t.Fatal("Execute against a silent host succeeded")
		}
		if !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), context.Canceled.Error()) {
			t.Errorf("a cancelled dial is not reported as cancelled: %v", err)
		}
		if !errors.Is(err, backends.ErrNotStarted) {
			t.Errorf("a cancelled dial does not say the command never reached the host: %v", err)
		}
	})
	t.Run("waiter-cancel", func(t *testing.T) {
		addr, accepted := silentServer(t)
		env := silentBackend(t, addr, 10*time.Minute)
		dialing, stopDialing := context.WithCancel(context.Background())
		first := make(chan error, 1)
		go func() {
			_, err := env.Execute(dialing, "true", backends.ExecOptions{})
			first <- err
		}()
		t.Cleanup(func() {
			stopDialing()
			select {
			case <-first:
			case <-time.After(hangGuard):
				// The silent server's cleanup, which runs next, ends it.
				t.Errorf("the dialing call ignored its own cancellation for %v", hangGuard)
			}
		})
		select {
		case <-accepted:
		case <-time.After(hangGuard):
			t.Fatal("the first call never connected")
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := tryCtx(t, ctx, env, "true", backends.ExecOptions{})
		if err == nil || !strings.Contains(err.Error(), context.Canceled.Error()) {
			t.Fatalf("a caller waiting for someone else's dial was not released by its cancellation: %v", err)
		}
	})
	t.Run("command-timeout", func(t *testing.T) {
		addr, _ := silentServer(t)
		env := silentBackend(t, addr, 10*time.Minute)
		_, err := tryCtx(t, context.Background(), env, "true", backends.ExecOptions{Timeout: time.Second})
		if !errors.Is(err, backends.ErrTimeout) || !errors.Is(err, backends.ErrNotStarted) {
			t.Fatalf("a Timeout that ran out while dialing: got %v, want ErrTimeout and ErrNotStarted", err)
		}
	})
}

// ---- re-dial -----------------------------------------------------------------

// After the connection is dropped (the sshd processes serving it are
// killed), the very next Execute re-dials and succeeds, every time.
func TestSSHRedialAfterKillSessions(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	env := newSSH(t, srv, u)
	mustRun(t, env, "true")
	for i := range 5 {
		if n := srv.KillSessions(t, u.Name); n != 1 {
			t.Fatalf("round %d: KillSessions dropped %d connections, want 1 (the backend's shared one)", i, n)
		}
		if got := mustRun(t, env, "echo round "+fmt.Sprint(i)); got != "round "+fmt.Sprint(i) {
			t.Fatalf("round %d: output %q", i, got)
		}
	}
	if n := logins(srv); n != 6 {
		t.Fatalf("%d logins, want 6 (one dial, then one re-dial per drop)", n)
	}
}

// After sshd restarts, the next Execute succeeds: over the surviving
// connection, then over a new one once that is dropped too. While sshd is
// down, a call fails (no hang), and that failure is not sticky.
func TestSSHAfterRestart(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	env := newSSH(t, srv, u)
	mustRun(t, env, "true")

	srv.Restart(t)
	if got := mustRun(t, env, "echo after restart"); got != "after restart" {
		t.Fatalf("output %q", got)
	}
	srv.KillSessions(t, u.Name)
	if got := mustRun(t, env, "echo new listener"); got != "new listener" {
		t.Fatalf("output %q", got)
	}

	srv.Stop(t)
	srv.KillSessions(t, u.Name)
	if _, err := try(t, env, "true"); err == nil {
		t.Fatal("Execute succeeded while sshd was down and the connection dropped")
	}
	srv.Restart(t)
	if got := mustRun(t, env, "echo back"); got != "back" {
		t.Fatalf("output %q", got)
	}
}

// A host whose key is certified by a CA listed with @cert-authority is
// trusted (the certificate algorithms are asked for, not the CA's own key
// type); a certificate from another CA is not, and @revoked still wins.
func TestSSHHostCertificateFromKnownCA(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{HostCertificates: true})
	u := srv.User(t, "", sshdtest.UserOptions{})
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, _ := ssh.NewSignerFromKey(other)
	host := knownhosts.Normalize(srv.Addr())
	for _, tc := range []struct {
		name, knownHosts string
		ok               bool
		refusal          string
	}{
		{"known CA", srv.CAKnownHostsLine() + "\n", true, ""},
		{"another CA", "@cert-authority " + host + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(otherCA.PublicKey()))) + "\n", false, "not trusted"},
		{"known CA, revoked host key", srv.CAKnownHostsLine() + "\n@revoked * " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(srv.HostKey(sshdtest.ED25519)))) + "\n", false, "revoked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kh := writeFile(t, "known_hosts", tc.knownHosts, 0o600)
			env := openSSH(t, "ssh://kdbox", backends.Options{SSHConfig: srv.WriteSSHConfig(t, "kdbox", u), SSHKnownHosts: kh})
			marker := filepath.Join(t.TempDir(), "ran")
			before := logins(srv)
			res, err := try(t, env, "touch "+marker+"; echo certified")
			if tc.ok {
				if err != nil || !strings.Contains(res.Output, "certified") {
					t.Fatalf("a host certified by a known CA: %+v, %v", res, err)
				}
				return
			}
			requireRefused(t, srv, err, marker, before)
			if !strings.Contains(strings.ToLower(err.Error()), tc.refusal) {
				t.Errorf("the refusal does not say %q: %v", tc.refusal, err)
			}
		})
	}
}
