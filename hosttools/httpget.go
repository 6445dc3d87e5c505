package hosttools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"
)

// AllowList says where http_get may connect. A URL's host must be an IP
// address inside Nets, or a name listed in Hosts whose addresses ALL lie
// inside Nets; connections go only to those checked addresses.
type AllowList struct {
	Hosts []string       // names, compared case-insensitively, trailing dot ignored
	Nets  []netip.Prefix // every address a connection may reach
}

// DefaultAllowList is loopback only: localhost, 127.0.0.0/8 and ::1.
func DefaultAllowList() AllowList {
	return AllowList{
		Hosts: []string{"localhost"},
		Nets:  []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
	}
}

// ErrHostNotAllowed is matched (errors.Is) by every refusal of a host or
// address that the allow-list does not cover.
var ErrHostNotAllowed = errors.New("host not in the http_get allow-list")

// String renders the list for error messages.
func (a AllowList) String() string {
	nets := make([]string, len(a.Nets))
	for i, n := range a.Nets {
		nets[i] = n.String()
	}
	return fmt.Sprintf("allowed hosts: %s; allowed addresses: %s", orNone(a.Hosts), orNone(nets))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func (a AllowList) allowsAddr(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("") // ::ffff:127.0.0.1 is 127.0.0.1
	return slices.ContainsFunc(a.Nets, func(n netip.Prefix) bool { return n.Contains(ip) })
}

func normalizeHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// checkHost refuses a host the list does not name: an IP address outside
// Nets, or a name not in Hosts. It needs no DNS, so a refused host costs no
// lookup.
func (a AllowList) checkHost(host string) error {
	if ip, err := netip.ParseAddr(host); err == nil {
		if !a.allowsAddr(ip) {
			return fmt.Errorf("address %s is not allowed (%s): %w", ip, a, ErrHostNotAllowed)
		}
		return nil
	}
	name := normalizeHost(host)
	if !slices.ContainsFunc(a.Hosts, func(h string) bool { return normalizeHost(h) == name }) {
		return fmt.Errorf("host %q is not allowed (%s): %w", host, a, ErrHostNotAllowed)
	}
	return nil
}

// resolve checks host and returns the addresses a connection may use. A
// name is resolved here, once, and every address it resolves to must be
// allowed: a name that also points elsewhere is refused outright rather
// than trimmed, because that is what DNS rebinding looks like.
func (a AllowList) resolve(ctx context.Context, host string, lookup func(context.Context, string) ([]netip.Addr, error)) ([]netip.Addr, error) {
	if err := a.checkHost(host); err != nil {
		return nil, err
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	name := normalizeHost(host)
	ips, err := lookup(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", name, err)
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("resolve %s: no addresses", name)
	}
	for _, ip := range ips {
		if !a.allowsAddr(ip) {
			return nil, fmt.Errorf("host %q resolves to %s, which is not allowed (%s): %w", host, ip, a, ErrHostNotAllowed)
		}
	}
	return ips, nil
}

// dialControl re-checks the address each socket is about to connect to.
// The dialer is only ever given checked addresses; this is the last line if
// a future change ever hands it a name.
func (a AllowList) dialControl(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: not an address: %w", address, ErrHostNotAllowed)
	}
	if !a.allowsAddr(ap.Addr()) {
		return fmt.Errorf("dial %s: address not allowed (%s): %w", address, a, ErrHostNotAllowed)
	}
	return nil
}

// HTTPResult is http_get's value.
type HTTPResult struct {
	Status      int               `json:"status"`
	URL         string            `json:"url"`     // after redirects
	Headers     map[string]string `json:"headers"` // the few listed in keptHeaders
	Body        string            `json:"body"`    // bytes that are not UTF-8 replaced by U+FFFD
	BodyClipped bool              `json:"body_clipped,omitempty"`
}

// keptHeaders are the response headers worth an agent's attention; the rest
// would only spend its context.
func keptHeaders() []string {
	return []string{"Content-Type", "Content-Length", "Last-Modified", "ETag", "Location", "Retry-After"}
}

// httpGet fetches one URL under the allow-list. A non-2xx status is a
// result, not an error: the agent decides what it means.
func (b *Builtins) httpGet(ctx context.Context, call Call) (Result, error) {
	raw, err := call.Args.Str("url", "")
	if err != nil {
		return Result{}, err
	}
	timeout, err := durationArg(call.Args, "timeout", orDefault(b.HTTPTimeout, DefaultHTTPTimeout), orDefault(b.HTTPMaxTimeout, MaxHTTPTimeout))
	if err != nil {
		return Result{}, err
	}
	u, err := checkURL(raw)
	if err != nil {
		return Result{}, err
	}
	allow := DefaultAllowList()
	if b.HTTPAllow != nil {
		allow = *b.HTTPAllow
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Result{}, fmt.Errorf("request %s: %w", u.Redacted(), err)
	}
	req.Header.Set("User-Agent", "kerneldeck-http_get")
	resp, err := b.httpClient(allow, timeout).Do(req)
	if err != nil {
		return Result{}, b.httpError(ctx, u, timeout, "", err)
	}
	defer resp.Body.Close()
	limit := orDefault(b.HTTPBodyLimit, DefaultHTTPBodyLimit)
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return Result{}, b.httpError(ctx, u, timeout, "read body: ", err)
	}
	out := HTTPResult{Status: resp.StatusCode, URL: resp.Request.URL.Redacted(), Headers: map[string]string{}}
	for _, h := range keptHeaders() {
		if v := resp.Header.Get(h); v != "" {
			out.Headers[h] = v
		}
	}
	if int64(len(body)) > limit {
		body, out.BodyClipped = body[:limit], true
	}
	out.Body = strings.ToValidUTF8(string(body), "\uFFFD")
	res := Result{Value: out}
	if out.BodyClipped {
		res.addNote(fmt.Sprintf("body clipped to its first %d bytes", limit))
	}
	return res, nil
}

// httpError words a failed request; a timeout says which limit to raise.
func (b *Builtins) httpError(ctx context.Context, u *url.URL, timeout time.Duration, what string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // its text repeats the URL, which the message names anyway
	}
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() && ctx.Err() == nil {
		return fmt.Errorf("GET %s: %sno complete answer within %v; send a larger timeout (at most %v seconds): %w",
			u.Redacted(), what, timeout, orDefault(b.HTTPMaxTimeout, MaxHTTPTimeout).Seconds(), err)
	}
	return fmt.Errorf("GET %s: %s%w", u.Redacted(), what, err)
}

func checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("url %q does not parse (%v); send an absolute http:// or https:// URL: %w", raw, err, ErrInvalidArgs)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("url %q: scheme %q is not allowed; send an http:// or https:// URL: %w", raw, u.Scheme, ErrInvalidArgs)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("url %q has no host; send an absolute URL such as http://127.0.0.1:8000/: %w", raw, ErrInvalidArgs)
	}
	return u, nil
}

// httpClient builds a client for one call. It never uses a proxy (the
// allow-list would then check the proxy, not the target), resolves and
// checks names itself and dials only the checked addresses, so the
// resolution that was checked is the one used: there is no second lookup
// for DNS rebinding to slip into. Every redirect is checked the same way.
func (b *Builtins) httpClient(allow AllowList, timeout time.Duration) *http.Client {
	lookup := b.LookupIP
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	dialer := &net.Dialer{Timeout: timeout, Control: allow.dialControl}
	transport := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("dial %s: %w", addr, err)
			}
			ips, err := allow.resolve(ctx, host, lookup)
			if err != nil {
				return nil, err
			}
			var errs []error
			for _, ip := range ips {
				conn, err := dialer.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
				if err == nil {
					return conn, nil
				}
				errs = append(errs, err)
			}
			return nil, errors.Join(errs...)
		},
		DisableKeepAlives:      true, // one client per call: nothing would reuse the connection
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{
		Transport: transport,
		Timeout:   timeout, // bounds the whole call, body included
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= defaultMaxHTTPRedirects {
				return fmt.Errorf("stopped after %d redirects", defaultMaxHTTPRedirects)
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %s refused: only http and https are allowed", req.URL.Redacted())
			}
			if err := allow.checkHost(req.URL.Hostname()); err != nil {
				return fmt.Errorf("redirect to %s refused: %w", req.URL.Redacted(), err)
			}
			return nil
		},
	}
}
