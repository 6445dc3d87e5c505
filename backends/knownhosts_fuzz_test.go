package backends

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// known_hosts decides whom kerneldeck sends code to. Its lines come from
// ssh-keyscan, other tools, hand edits and kerneldeck's own accept-new.
// FuzzKnownHosts checks SSH.hostKeyCheck (the callback the handshake uses,
// and the accept-new writer) against an independent reading of the file.

// khKeys are the host keys a fuzzed file can name: @A and @B (ed25519) and
// @C (ecdsa) in the file stand for "<type> <base64>" of each; @H stands for
// the hashed form (|1|salt|hash) of the host being checked.
type khKeys struct {
	pub  [3]ssh.PublicKey
	text [3]string
}

func newKHKeys(tb testing.TB) *khKeys {
	var k khKeys
	for i := range 2 {
		seed := bytes.Repeat([]byte{byte('a' + i)}, ed25519.SeedSize)
		pub, err := ssh.NewPublicKey(ed25519.NewKeyFromSeed(seed).Public())
		if err != nil {
			tb.Fatal(err)
		}
		k.pub[i] = pub
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	if k.pub[2], err = ssh.NewPublicKey(&ec.PublicKey); err != nil {
		tb.Fatal(err)
	}
	for i, p := range k.pub {
		k.text[i] = p.Type() + " " + base64.StdEncoding.EncodeToString(p.Marshal())
	}
	return &k
}

// hashName is OpenSSH's HashKnownHosts form of name, with a fixed salt.
func hashName(name string) string {
	salt := bytes.Repeat([]byte{7}, sha1.Size)
	mac := hmac.New(sha1.New, salt)
	mac.Write([]byte(name))
	return "|1|" + base64.StdEncoding.EncodeToString(salt) + "|" + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// khName is how known_hosts names host:port: host for port 22, else
// [host]:port.
func khName(host string, port int) string {
	if port == 22 {
		return host
	}
	return "[" + host + "]:" + strconv.Itoa(port)
}

// khLine is one entry as OpenSSH's sshd(8) documents the format.
type khLine struct {
	marker   string // "", "@cert-authority" or "@revoked"
	patterns string
	key      ssh.PublicKey // nil: the line is invalid and ignored
}

func parseKHFile(text string) []khLine {
	var out []khLine
	for l := range strings.SplitSeq(text, "\n") {
		l = strings.Trim(strings.TrimSuffix(l, "\r"), " \t")
		if l == "" || l[0] == '#' {
			continue
		}
		f := strings.FieldsFunc(l, func(r rune) bool { return r == ' ' || r == '\t' })
		var e khLine
		if f[0] == "@cert-authority" || f[0] == "@revoked" {
			e.marker, f = f[0], f[1:]
		}
		if len(f) < 3 || strings.HasPrefix(f[0], "@") {
			out = append(out, e)
			continue
		}
		e.patterns = f[0]
		if blob, err := base64.StdEncoding.DecodeString(f[2]); err == nil {
			if k, err := ssh.ParsePublicKey(blob); err == nil && k.Type() == f[1] {
				e.key = k
			}
		}
		out = append(out, e)
	}
	return out
}

// glob is OpenSSH's match_pattern: * and ? over the whole string. It
// backtracks only to the last star, so it takes O(len(pat)*len(s)) time
// (a naive recursion hung the fuzzer on "********0").
func glob(pat, s string) bool {
	p, i, star, mark := 0, 0, -1, 0
	for i < len(s) {
		switch {
		case p < len(pat) && (pat[p] == '?' || pat[p] == s[i]):
			p++
			i++
		case p < len(pat) && pat[p] == '*':
			star, mark = p, i
			p++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pat) && pat[p] == '*' {
		p++
	}
	return p == len(pat)
}

// mightMatch over-approximates whether e's patterns can match host:port:
// negations are ignored (they only remove matches) and a pattern is tried
// against every form of the name.
func (e khLine) mightMatch(host string, port int) bool {
	name := khName(host, port)
	if strings.HasPrefix(e.patterns, "|") {
		parts := strings.Split(e.patterns, "|")
		if len(parts) != 4 {
			return false
		}
		salt, err1 := base64.StdEncoding.DecodeString(parts[2])
		want, err2 := base64.StdEncoding.DecodeString(parts[3])
		if err1 != nil || err2 != nil {
			return false
		}
		for _, n := range []string{name, host} {
			mac := hmac.New(sha1.New, salt)
			mac.Write([]byte(n))
			if hmac.Equal(mac.Sum(nil), want) {
				return true
			}
		}
		return false
	}
	for p := range strings.SplitSeq(e.patterns, ",") {
		p = strings.TrimPrefix(p, "!")
		if glob(p, name) || glob(p, host) || glob(p, "["+host+"]") {
			return true
		}
		if h, pp, err := net.SplitHostPort(p); err == nil && pp == strconv.Itoa(port) && glob(h, host) {
			return true
		}
	}
	return false
}

// surelyMatches under-approximates: a plain entry that lists the exact name
// and negates nothing.
func (e khLine) surelyMatches(host string, port int) bool {
	if e.marker != "" || e.key == nil || strings.ContainsAny(e.patterns, "!|") {
		return false
	}
	for p := range strings.SplitSeq(e.patterns, ",") {
		if p == khName(host, port) {
			return true
		}
	}
	return false
}

var knownHostsSeeds = []struct {
	file, host string
	port       uint16
	key        uint8
	acceptNew  bool
}{
	{"box @A\n", "box", 22, 0, false},                                       // known
	{"box @A\n", "box", 22, 1, true},                                        // changed: refused even with accept-new
	{"box @C\n", "box", 22, 0, true},                                        // another type on file: refused
	{"other @A\n", "box", 22, 0, true},                                      // unknown: recorded
	{"other @A\n", "box", 22, 0, false},                                     // unknown: refused
	{"[box]:2222 @A\n", "box", 2222, 0, false},                              // non-standard port
	{"[box]:2222 @A\n", "box", 22, 0, true},                                 // other port: unknown
	{"box @A\n", "box", 2222, 1, true},                                      // port 22 entry does not cover 2222
	{"*.example.com @A\n", "a.example.com", 22, 0, false},                   // wildcard
	{"*.example.com,!bad.example.com @A\n", "bad.example.com", 22, 0, true}, // negated
	{"@H @A\n", "box", 22, 0, false},                                        // hashed
	{"@H @B\n", "box", 22, 0, true},                                         // hashed, changed
	{"@revoked * @A\nbox @A\n", "box", 22, 0, true},                         // revoked
	{"@cert-authority *.example.com @B\n", "a.example.com", 22, 0, true},
	{"# comment\n\n  box   @A   comment here\r\n", "box", 22, 0, false},
	{"box @A", "other", 22, 1, true},           // no newline at the end
	{"garbage\n", "box", 22, 0, true},          // no valid line: error
	{"garbage\nbox @A\n", "box", 22, 0, false}, // one bad line is skipped
	{"box ssh-ed25519 AAAA\nbox @B\n", "box", 22, 1, false},
	{"", "box", 22, 0, true},
	{"", "::1", 2222, 0, true},
	{"", "*", 22, 0, true},
	{"", "a,b", 22, 0, true},
	{"", "box", 0, 2, true},
}

// FuzzKnownHosts runs the host key check for (host, port, key) against a
// fuzzed known_hosts file, with and without accept-new. It never panics;
// a key is authenticated only when a line that can match the host lists it
// and no @revoked line does; a host whose entry lists another key is
// refused and never recorded; without accept-new the file is never
// written; with it, the file changes only by one appended line, which
// leaves every existing line as it was, authenticates exactly this key for
// exactly this host (no other name, no other port), and is owner-only.
func FuzzKnownHosts(f *testing.F) {
	for _, s := range knownHostsSeeds {
		f.Add(s.file, s.host, s.port, s.key, s.acceptNew)
	}
	keys := newKHKeys(f)
	f.Fuzz(func(t *testing.T, file, host string, port uint16, keyIdx uint8, acceptNew bool) {
		p := int(port)
		if p == 0 {
			p = 22
		}
		file = strings.NewReplacer("@A", keys.text[0], "@B", keys.text[1], "@C", keys.text[2], "@H", hashName(khName(host, p))).Replace(file)
		key := keys.pub[int(keyIdx)%3]
		dir := t.TempDir()
		kh := filepath.Join(dir, "known_hosts")
		if err := os.WriteFile(kh, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &SSH{opts: Options{AcceptNewHostKey: acceptNew}}
		tg := sshTarget{alias: host, hostName: host, port: p, knownHosts: []string{kh}}
		cb, _, err := s.hostKeyCheck(tg)
		if err != nil {
			if !strings.Contains(err.Error(), "known_hosts") {
				t.Fatalf("error %q does not name known_hosts", err)
			}
			return
		}
		cerr := cb(tg.addr(), &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p}, key)
		after, err := os.ReadFile(kh)
		if err != nil {
			t.Fatal(err)
		}
		changed := string(after) != file
		lines := parseKHFile(file)
		revoked, listed, conflict := false, false, false
		for _, e := range lines {
			if e.key == nil {
				continue
			}
			same := bytes.Equal(e.key.Marshal(), key.Marshal())
			switch {
			case e.marker == "@revoked" && same:
				revoked = true
			case e.marker != "@revoked" && same && e.mightMatch(host, p):
				listed = true
			case !same && e.surelyMatches(host, p):
				conflict = true
			}
		}
		if changed && !acceptNew {
			t.Fatalf("known_hosts was written without accept-new:\nbefore %q\nafter  %q", file, after)
		}
		if cerr == nil && !changed {
			if !listed {
				t.Fatalf("key %d authenticated for %s, but no line that can match it lists the key:\n%q", keyIdx%3, khName(host, p), file)
			}
			if revoked {
				t.Fatalf("a @revoked key authenticated for %s:\n%q", khName(host, p), file)
			}
		}
		if (conflict || revoked) && (cerr == nil || changed) {
			t.Fatalf("%s has another key on file (conflict %v) or this key is revoked (%v), but the check passed (err %v) or recorded it (changed %v):\nbefore %q\nafter  %q",
				khName(host, p), conflict, revoked, cerr, changed, file, after)
		}
		if !changed {
			return
		}
		if cerr != nil {
			t.Fatalf("the key was recorded but the check failed: %v", cerr)
		}
		// One appended line that leaves every existing line intact (after
		// ending an unfinished last line).
		base := file
		if base != "" && !strings.HasSuffix(base, "\n") {
			base += "\n"
		}
		added, ok := strings.CutPrefix(string(after), base)
		if !ok || strings.Count(added, "\n") != 1 || !strings.HasSuffix(added, "\n") {
			t.Fatalf("accept-new did not append exactly one line after the existing ones:\nbefore %q\nafter  %q", file, after)
		}
		if st, err := os.Stat(kh); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("known_hosts mode %v after accept-new (%v)", st.Mode(), err)
		}
		// The new line alone: this key for this host, and nothing else.
		only := filepath.Join(dir, "only_new")
		if err := os.WriteFile(only, []byte(added), 0o600); err != nil {
			t.Fatal(err)
		}
		ocb, err := knownhosts.New(only)
		if err != nil {
			t.Fatalf("the recorded line %q does not parse: %v", added, err)
		}
		local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p}
		if err := ocb(tg.addr(), local, key); err != nil {
			t.Fatalf("the recorded line %q does not authenticate the key for %s: %v", added, tg.addr(), err)
		}
		for _, other := range []string{"kd-other.invalid:22", "kd-other.invalid:" + strconv.Itoa(p), net.JoinHostPort(host, strconv.Itoa(p%65535+1))} {
			if other == tg.addr() {
				continue
			}
			if err := ocb(other, local, key); err == nil {
				t.Fatalf("the line %q recorded for %s also authenticates the key for %s", added, tg.addr(), other)
			}
		}
	})
}

// TestAcceptNewKeepsAnUnterminatedLastLine: a known_hosts whose last line
// has no newline (a hand edit) used to get the accepted line glued onto it,
// which broke that line's key: the host it named became unknown, and the
// next accept-new connection to it trusted whatever key it was shown (or,
// when that was the only line, every later connection failed).
func TestAcceptNewKeepsAnUnterminatedLastLine(t *testing.T) {
	keys := newKHKeys(t)
	kh := filepath.Join(t.TempDir(), "known_hosts")
	before := "gw " + keys.text[2] + "\nbox " + keys.text[0]
	if err := os.WriteFile(kh, []byte(before), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &SSH{opts: Options{AcceptNewHostKey: true}}
	local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 22}
	check := func(host string, key ssh.PublicKey) error {
		tg := sshTarget{alias: host, hostName: host, port: 22, knownHosts: []string{kh}}
		cb, _, err := s.hostKeyCheck(tg)
		if err != nil {
			t.Fatal(err)
		}
		return cb(tg.addr(), local, key)
	}
	if err := check("other", keys.pub[1]); err != nil {
		t.Fatalf("accept-new of an unknown host: %v", err)
	}
	// box still has key A on file: an impostor's key B is refused, not recorded.
	if err := check("box", keys.pub[1]); err == nil || !strings.Contains(err.Error(), "CHANGED") {
		t.Fatalf("box shown another key after accept-new wrote to the file: %v, want a CHANGED refusal", err)
	}
	if err := check("box", keys.pub[0]); err != nil {
		t.Fatalf("box's own key: %v", err)
	}
	data, _ := os.ReadFile(kh)
	if want := before + "\nother " + keys.text[1] + "\n"; string(data) != want {
		t.Fatalf("known_hosts:\n%q\nwant\n%q", data, want)
	}
}

// A host name that would be a pattern in known_hosts is never recorded.
func TestAcceptNewRefusesPatternNames(t *testing.T) {
	keys := newKHKeys(t)
	for _, host := range []string{"*", "*.example.com", "a,b", "!x", "h?st", "[x]", "a:b", ""} {
		kh := filepath.Join(t.TempDir(), "known_hosts")
		s := &SSH{opts: Options{AcceptNewHostKey: true}}
		tg := sshTarget{alias: host, hostName: host, port: 22, knownHosts: []string{kh}}
		cb, _, err := s.hostKeyCheck(tg)
		if err != nil {
			t.Fatal(err)
		}
		err = cb(tg.addr(), &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 22}, keys.pub[0])
		if err == nil || !strings.Contains(err.Error(), "not a plain host name") {
			t.Errorf("accept-new for %q: %v, want a refusal", host, err)
		}
		if _, err := os.Stat(kh); !os.IsNotExist(err) {
			t.Errorf("accept-new for %q created %s", host, kh)
		}
	}
}
