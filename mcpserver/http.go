package mcpserver

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrNotLoopback refuses an HTTP address other machines could reach.
var ErrNotLoopback = errors.New("not a loopback address")

// minToken is the shortest bearer token accepted.
const minToken = 16

// ReadToken reads a bearer token from path: a regular file of this user,
// not a symlink, readable by nobody else (0600 or stricter), holding one
// line of at least 16 characters.
func ReadToken(path string) (string, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("token file %s is not a regular file (%v): write the token into a file of its own", path, st.Mode().Type())
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("token file %s has mode %04o: others may read it; chmod 600 %s", path, st.Mode().Perm(), path)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return "", fmt.Errorf("token file %s belongs to uid %d, not to you (uid %d)", path, sys.Uid, os.Geteuid())
	}
	if st.Size() > 4096 {
		return "", fmt.Errorf("token file %s is %d bytes; a token is one line", path, st.Size())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := string(bytes.TrimSpace(b))
	if len(tok) < minToken || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("token file %s must hold one token of at least %d characters without blanks, e.g. from: openssl rand -hex 32", path, minToken)
	}
	return tok, nil
}

// ListenHTTP opens addr for streamable HTTP: "unix:PATH" (or a path with a
// slash), a socket made 0600 in a directory of this user's, or a loopback
// HOST:PORT. Anything another machine could reach is refused.
func ListenHTTP(addr string) (net.Listener, string, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok || strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "./") {
		if !ok {
			path = addr
		}
		return listenUnix(path)
	}
	if err := CheckHTTPAddr(addr); err != nil {
		return nil, "", err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--http %s: %w", addr, err)
	}
	return l, "http://" + l.Addr().String() + "/", nil
}

// CheckHTTPAddr refuses an --http address that is not a Unix socket or a
// loopback HOST:PORT.
func CheckHTTPAddr(addr string) error {
	if strings.HasPrefix(addr, "unix:") || strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "./") {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--http %q: %w; give 127.0.0.1:PORT, [::1]:PORT, localhost:PORT or unix:PATH", addr, err)
	}
	if host != "localhost" {
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("--http %q: %w; kerneldeck mcp serves only this machine (127.0.0.1:PORT, [::1]:PORT, localhost:PORT or unix:PATH); reach it from elsewhere through ssh -L", addr, ErrNotLoopback)
		}
	}
	return nil
}

func listenUnix(path string) (net.Listener, string, error) {
	dir := filepath.Dir(path)
	st, err := os.Lstat(dir)
	if err != nil {
		return nil, "", fmt.Errorf("--http unix:%s: %w", path, err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !st.IsDir() || (ok && int(sys.Uid) != os.Geteuid()) || st.Mode().Perm()&0o022 != 0 {
		return nil, "", fmt.Errorf("--http unix:%s: its directory %s must be a directory of yours that others cannot write (chmod 700 %s)", path, dir, dir)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return nil, "", fmt.Errorf("--http unix:%s: a file that is not a socket is there; remove it or pick another path", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, "", fmt.Errorf("--http unix:%s: a server already listens there", path)
		}
		os.Remove(path) // stale: its server is gone
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, "", fmt.Errorf("--http unix:%s: %w", path, err)
	}
	return l, "unix:" + path, nil
}

// Handler is streamable HTTP for s, for requests bearing the token.
func (s *Server) Handler(token string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, nil)
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kerneldeck"`)
			http.Error(w, "missing or wrong bearer token: send Authorization: Bearer <the token in kerneldeck mcp's --token-file>", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
