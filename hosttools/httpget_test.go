package hosttools

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeDNS answers lookups from a table and records every name asked, so a
// test can prove a refused host cost no DNS query. Nothing here ever
// resolves or dials a non-loopback address.
type fakeDNS struct {
	mu    sync.Mutex
	table map[string][]netip.Addr
	asked []string
}

func (d *fakeDNS) lookup(_ context.Context, host string) ([]netip.Addr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked = append(d.asked, host)
	if ips, ok := d.table[host]; ok {
		return ips, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// countingServer is a loopback server that counts its requests.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func port(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Port()
}

func httpValue(t *testing.T, res Result) HTTPResult {
	t.Helper()
	v, ok := res.Value.(HTTPResult)
	if !ok {
		t.Fatalf("http_get value = %#v", res.Value)
	}
	return v
}

func TestHTTPGetLoopback(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Internal", "not kept")
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprint(w, "hello from ", r.URL.Path)
	})
	r := newBuiltins(t, &Builtins{}) // the default allow-list and the system resolver
	for _, u := range []string{srv.URL + "/a", "http://localhost:" + port(t, srv) + "/b"} {
		res, err := dispatch(t, r, "http_get", map[string]any{"url": u})
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		v := httpValue(t, res)
		path := u[strings.LastIndexByte(u, '/'):]
		if v.Status != http.StatusTeapot || v.Body != "hello from "+path || v.Headers["Content-Type"] != "text/plain" || v.BodyClipped {
			t.Errorf("GET %s = %+v", u, v)
		}
		if _, ok := v.Headers["X-Internal"]; ok {
			t.Errorf("headers = %v, want only the kept few", v.Headers)
		}
	}
}

func TestHTTPGetRefusesHosts(t *testing.T) {
	srv, hits := countingServer(t, func(w http.ResponseWriter, r *http.Request) {})
	p := port(t, srv)
	dns := &fakeDNS{table: map[string][]netip.Addr{
		"mixed.test":    addrs("127.0.0.1", "10.9.9.9"), // rebinding-style: one good, one bad address
		"unlisted.test": addrs("127.0.0.1"),
	}}
	allow := DefaultAllowList()
	allow.Hosts = append(allow.Hosts, "mixed.test")
	r := newBuiltins(t, &Builtins{HTTPAllow: &allow, LookupIP: dns.lookup})
	tests := []struct {
		url  string
		want string
	}{
		{"http://example.invalid/", `host "example.invalid" is not allowed`},
		{"http://unlisted.test:" + p + "/", `host "unlisted.test" is not allowed`},
		{"http://192.0.2.1/", "address 192.0.2.1 is not allowed"},
		{"https://10.0.0.1:" + p + "/", "address 10.0.0.1 is not allowed"},
		{"http://[fe80::1%25eth0]/", "address fe80::1%eth0 is not allowed"},
		{"http://mixed.test:" + p + "/", `host "mixed.test" resolves to 10.9.9.9, which is not allowed`},
	}
	for _, tc := range tests {
		t.Run(tc.url, func(t *testing.T) {
			_, err := dispatch(t, r, "http_get", map[string]any{"url": tc.url})
			if !errors.Is(err, ErrHostNotAllowed) {
				t.Fatalf("GET %s: err = %v, want ErrHostNotAllowed", tc.url, err)
			}
			mustContain(t, "error", err.Error(), tc.want, "allowed hosts: localhost, mixed.test; allowed addresses: 127.0.0.0/8, ::1/128")
		})
	}
	if hits.Load() != 0 {
		t.Errorf("the server got %d requests from refused URLs", hits.Load())
	}
	if got := strings.Join(dns.asked, ","); got != "mixed.test" {
		t.Errorf("DNS was asked for %q; only the listed name may be resolved", got)
	}
}

func TestHTTPGetListedName(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, r.Host) })
	dns := &fakeDNS{table: map[string][]netip.Addr{"svc.test": addrs("127.0.0.1")}}
	allow := AllowList{Hosts: []string{"SVC.test."}, Nets: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	r := newBuiltins(t, &Builtins{HTTPAllow: &allow, LookupIP: dns.lookup})
	u := "http://svc.test:" + port(t, srv) + "/"
	res, err := dispatch(t, r, "http_get", map[string]any{"url": u})
	if err != nil {
		t.Fatal(err)
	}
	if v := httpValue(t, res); v.Status != 200 || v.Body != "svc.test:"+port(t, srv) {
		t.Errorf("GET %s = %+v; the Host header must stay the name", u, v)
	}
}

// The environment's proxy must not be used: the allow-list would then be
// checked against the proxy instead of the target. (net/http reads the
// proxy variables once per process, so the request below proves it only
// when run alone; the transport check proves it in any order.)
func TestHTTPGetIgnoresProxyEnv(t *testing.T) {
	if tr := (&Builtins{}).httpClient(DefaultAllowList(), time.Second).Transport.(*http.Transport); tr.Proxy != nil {
		t.Error("the http_get transport has a Proxy function")
	}
	proxy, proxyHits := countingServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "via proxy") })
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "direct") })
	t.Setenv("HTTP_PROXY", proxy.URL)
	t.Setenv("http_proxy", proxy.URL)
	dns := &fakeDNS{table: map[string][]netip.Addr{"svc.test": addrs("127.0.0.1")}}
	allow := DefaultAllowList()
	allow.Hosts = append(allow.Hosts, "svc.test")
	r := newBuiltins(t, &Builtins{HTTPAllow: &allow, LookupIP: dns.lookup})
	res, err := dispatch(t, r, "http_get", map[string]any{"url": "http://svc.test:" + port(t, srv) + "/"})
	if err != nil {
		t.Fatal(err)
	}
	if v := httpValue(t, res); v.Body != "direct" || proxyHits.Load() != 0 {
		t.Errorf("body %q, proxy hits %d; want a direct request", v.Body, proxyHits.Load())
	}
}

func TestHTTPGetRedirects(t *testing.T) {
	denied, deniedHits := countingServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "should not be reached") })
	dns := &fakeDNS{table: map[string][]netip.Addr{
		"allowed.test": addrs("127.0.0.1"),
		"denied.test":  addrs("127.0.0.1"), // resolvable, so only the allow-list stands in the way
	}}
	allow := AllowList{Hosts: []string{"allowed.test"}, Nets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	var base string
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/to-denied-name":
			http.Redirect(w, r, "http://denied.test:"+port(t, denied)+"/", http.StatusFound)
		case "/to-outside-ip":
			http.Redirect(w, r, "http://192.0.2.1/", http.StatusFound)
		case "/to-file":
			http.Redirect(w, r, "file:///etc/passwd", http.StatusFound)
		case "/to-allowed":
			http.Redirect(w, r, base+"/final", http.StatusMovedPermanently)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/final":
			fmt.Fprint(w, "final")
		}
	})
	base = "http://allowed.test:" + port(t, srv)
	r := newBuiltins(t, &Builtins{HTTPAllow: &allow, LookupIP: dns.lookup})

	res, err := dispatch(t, r, "http_get", map[string]any{"url": base + "/to-allowed"})
	if err != nil {
		t.Fatal(err)
	}
	if v := httpValue(t, res); v.Body != "final" || v.URL != base+"/final" {
		t.Errorf("allowed redirect = %+v", v)
	}
	for path, want := range map[string]string{
		"/to-denied-name": `redirect to http://denied.test:` + port(t, denied) + `/ refused: host "denied.test" is not allowed`,
		"/to-outside-ip":  "redirect to http://192.0.2.1/ refused: address 192.0.2.1 is not allowed",
		"/to-file":        "redirect to file:///etc/passwd refused: only http and https",
		"/loop":           "stopped after 5 redirects",
	} {
		_, err := dispatch(t, r, "http_get", map[string]any{"url": base + path})
		if err == nil {
			t.Errorf("GET %s followed the redirect", path)
			continue
		}
		mustContain(t, "error", err.Error(), want)
	}
	if deniedHits.Load() != 0 {
		t.Errorf("the disallowed host got %d requests", deniedHits.Load())
	}
}

func TestHTTPGetBodyCap(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strings.Repeat("z", DefaultHTTPBodyLimit+100))
	})
	for _, tc := range []struct {
		limit int64
		want  int
	}{{10, 10}, {0, DefaultHTTPBodyLimit}} {
		r := newBuiltins(t, &Builtins{HTTPBodyLimit: tc.limit})
		res, err := dispatch(t, r, "http_get", map[string]any{"url": srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		if v := httpValue(t, res); len(v.Body) != tc.want || !v.BodyClipped {
			t.Errorf("limit %d: body %d bytes, clipped %v; want %d, clipped", tc.limit, len(v.Body), v.BodyClipped, tc.want)
		}
		mustContain(t, "note", res.Note, fmt.Sprintf("body clipped to its first %d bytes", tc.want))
	}
}

// A server that stalls before its headers or in the middle of its body
// cannot hold the call past its timeout.
func TestHTTPGetTimeout(t *testing.T) {
	release := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/body" {
			fmt.Fprint(w, "partial")
			w.(http.Flusher).Flush()
		}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	r := newBuiltins(t, &Builtins{})
	for path, want := range map[string]string{"/headers": ": no complete answer", "/body": ": read body: no complete answer"} {
		_, err := dispatch(t, r, "http_get", map[string]any{"url": srv.URL + path, "timeout": 0.2})
		if err == nil {
			t.Fatalf("a server stalling in %s did not time out", path)
		}
		mustContain(t, "error", err.Error(), "GET "+srv.URL+path+want+" within 200ms", "at most 120 seconds")
	}
}

func TestHTTPGetArgErrors(t *testing.T) {
	r := newBuiltins(t, &Builtins{})
	for _, args := range []map[string]any{
		{"url": "file:///etc/passwd"},
		{"url": "ftp://127.0.0.1/"},
		{"url": "/relative"},
		{"url": "http://"},
		{"url": "http://127.0.0.1/", "timeout": 121},
		{"url": "http://127.0.0.1/", "timeout": 0},
	} {
		if _, err := dispatch(t, r, "http_get", args); !errors.Is(err, ErrInvalidArgs) {
			t.Errorf("http_get %v: err = %v, want ErrInvalidArgs", args, err)
		}
	}
}

func TestAllowListAddresses(t *testing.T) {
	allow := DefaultAllowList()
	for addr, want := range map[string]bool{
		"127.0.0.1": true, "127.255.0.9": true, "::1": true, "::ffff:127.0.0.1": true,
		"128.0.0.1": false, "10.0.0.1": false, "::2": false, "::ffff:10.0.0.1": false, "0.0.0.0": false, "169.254.169.254": false,
	} {
		if got := allow.allowsAddr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("allowsAddr(%s) = %v, want %v", addr, got, want)
		}
	}
	// The dialer's last check refuses what the list does not cover, even if
	// a future change hands it an address that skipped resolve.
	for addr, wantErr := range map[string]bool{"127.0.0.1:80": false, "[::1]:443": false, "10.0.0.1:80": true, "example.com:80": true} {
		if err := allow.dialControl("tcp", addr, nil); (err != nil) != wantErr || (err != nil && !errors.Is(err, ErrHostNotAllowed)) {
			t.Errorf("dialControl(%s) = %v, want error %v", addr, err, wantErr)
		}
	}
	if err := (AllowList{}).checkHost("localhost"); !errors.Is(err, ErrHostNotAllowed) {
		t.Errorf("an empty allow-list allowed localhost: %v", err)
	}
}
