package backends

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A known_hosts file that would hang the host key check is refused with
// where and why: a FIFO (opening it blocks), and a host pattern with so
// many wildcards that x/crypto's backtracking matcher would take minutes.
func TestKnownHostsThatWouldHang(t *testing.T) {
	keys := newKHKeys(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stars := write("stars", "# fine\nbox "+keys.text[0]+"\n@revoked *a*b*c*d*e*f*g*h*0 "+keys.text[1]+"\n")
	fine := write("fine", "*.example.com,!*bad*.example.com "+keys.text[0]+"\n")
	host := strings.Repeat("a", 60) + ".example.com"
	for _, tc := range []struct{ file, want string }{
		{fifo, "is a named pipe, not a regular file"},
		{stars, "line 3: host pattern \"*a*b*c*d*e*f*g*h*0\" has 9 '*' wildcards"},
		{fine, ""},
	} {
		done := make(chan error, 1)
		go func() {
			s := &SSH{}
			cb, _, err := s.hostKeyCheck(sshTarget{alias: host, hostName: host, port: 22, knownHosts: []string{tc.file}})
			if err == nil {
				err = cb(host+":22", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 22}, keys.pub[0])
			}
			done <- err
		}()
		select {
		case err := <-done:
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s: %v, want the key accepted", tc.file, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.file)):
				t.Errorf("%s: %v; want an error naming the file and saying %q", tc.file, err, tc.want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the host key check did not return", tc.file)
		}
	}
}

// The fuzz oracle's glob agrees with the plain recursive definition on
// every short pattern and name over a small alphabet.
func TestGlobAgreesWithRecursion(t *testing.T) {
	var naive func(pat, s string) bool
	naive = func(pat, s string) bool {
		if pat == "" {
			return s == ""
		}
		if pat[0] == '*' {
			for i := 0; i <= len(s); i++ {
				if naive(pat[1:], s[i:]) {
					return true
				}
			}
			return false
		}
		return s != "" && (pat[0] == '?' || pat[0] == s[0]) && naive(pat[1:], s[1:])
	}
	var all func(alphabet string, n int) []string
	all = func(alphabet string, n int) []string {
		if n == 0 {
			return []string{""}
		}
		out := []string{""}
		for _, rest := range all(alphabet, n-1) {
			for _, c := range alphabet {
				out = append(out, string(c)+rest)
			}
		}
		return out
	}
	names := all("ab", 4)
	for _, pat := range all("ab*?", 4) {
		for _, s := range names {
			if glob(pat, s) != naive(pat, s) {
				t.Fatalf("glob(%q, %q) = %v, want %v", pat, s, glob(pat, s), naive(pat, s))
			}
		}
	}
}
