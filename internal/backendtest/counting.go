package backendtest

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/kerneldeck/kerneldeck/backends"
)

// Counting is an Env wrapper for tests that counts backend round trips:
// Execute calls in total and per script marker (the first line of every
// engine script is a marker comment such as "# kerneldeck:spawn"), the
// commands themselves, and, when the wrapped Env offers streams, the request
// frames written on them (one '\n'-terminated JSON line each).
//
// A Counting made by NewCounting implements backends.StreamDialer exactly
// when backends.StreamsOf(inner) finds one, so wrapping an Env never adds or
// hides a fast path. It implements backends.Wrapper.
type Counting interface {
	backends.Env
	backends.Wrapper
	// Executes is the number of Execute calls so far.
	Executes() int
	// ByMarker is the number of Execute calls whose command starts with the
	// marker comment; marker may be "cell", "kerneldeck:cell" or
	// "# kerneldeck:cell". ByMarker("") counts commands without a marker.
	ByMarker(marker string) int
	// Returned is ByMarker counting only the calls that have returned.
	Returned(marker string) int
	// Markers is the per-marker count of Execute calls.
	Markers() map[string]int
	// Commands lists the commands in call order (never the stdin payloads).
	Commands() []string
	// Frames is the number of frames written on streams dialed through this
	// Env, the handshake's excepted (FramesByOp("auth") counts those).
	Frames() int
	// FramesByOp counts the written frames whose JSON "op" field is op.
	FramesByOp(op string) int
	// Dials is the number of DialUnix calls.
	Dials() int
	// Reset zeroes every counter and forgets the recorded commands.
	Reset()
}

// NewCounting wraps inner in a Counting.
func NewCounting(inner backends.Env) Counting {
	return newCounting(inner, &stats{markers: map[string]int{}, returned: map[string]int{}, frameOps: map[string]int{}})
}

func newCounting(inner backends.Env, st *stats) Counting {
	c := &counting{inner: inner, stats: st}
	if p, ok := inner.(backends.Provisioner); ok {
		return &countingProvisioner{counting: c, p: p}
	}
	if d := backends.StreamsOf(inner); d != nil {
		return &countingStreams{counting: c, dialer: d}
	}
	return c
}

// countingProvisioner is a Counting over a backend that gives each kernel a
// host of its own: those hosts are counted too, in the same counters.
type countingProvisioner struct {
	*counting
	p backends.Provisioner
}

func (c *countingProvisioner) Provision(ctx context.Context, key string) (backends.Env, error) {
	c.mu.Lock()
	c.provisions++
	c.mu.Unlock()
	env, err := c.p.Provision(ctx, key)
	if err != nil {
		return nil, err
	}
	return newCounting(env, c.stats), nil
}

// Provisions is how many hosts a provisioning backend made (0 for others).
func Provisions(c Counting) int {
	cp, ok := c.(*countingProvisioner)
	if !ok {
		return 0
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.provisions
}

const markerPrefix = "# kerneldeck:"

// MarkerOf returns the marker of an engine script ("spawn" for a command whose
// first line is "# kerneldeck:spawn"), or "" when it has none.
func MarkerOf(command string) string {
	first, _, _ := strings.Cut(command, "\n")
	rest, ok := strings.CutPrefix(strings.TrimSpace(first), markerPrefix)
	if !ok {
		return ""
	}
	if f := strings.Fields(rest); len(f) > 0 {
		return f[0]
	}
	return ""
}

func normalizeMarker(m string) string {
	m = strings.TrimSpace(m)
	m = strings.TrimPrefix(m, "#")
	m = strings.TrimSpace(m)
	return strings.TrimPrefix(m, "kerneldeck:")
}

type counting struct {
	inner backends.Env
	*stats
}

// stats are a Counting's counters, shared with the Countings of the hosts
// it provisions.
type stats struct {
	mu         sync.Mutex
	provisions int
	executes   int
	markers    map[string]int
	returned   map[string]int
	commands   []string
	frames     int
	frameOps   map[string]int
	dials      int
}

func (c *counting) Unwrap() backends.Env { return c.inner }
func (c *counting) TempDir() string      { return c.inner.TempDir() }
func (c *counting) URI() string          { return c.inner.URI() }

func (c *counting) Execute(ctx context.Context, command string, opts backends.ExecOptions) (backends.Result, error) {
	c.mu.Lock()
	c.executes++
	c.markers[MarkerOf(command)]++
	c.commands = append(c.commands, command)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.returned[MarkerOf(command)]++
		c.mu.Unlock()
	}()
	return c.inner.Execute(ctx, command, opts)
}

func (c *counting) Returned(marker string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.returned[normalizeMarker(marker)]
}

func (c *counting) Executes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.executes
}

func (c *counting) ByMarker(marker string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.markers[normalizeMarker(marker)]
}

func (c *counting) Markers() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.markers)
}

func (c *counting) Commands() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.commands)
}

func (c *counting) Frames() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

func (c *counting) FramesByOp(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frameOps[op]
}

func (c *counting) Dials() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dials
}

func (c *counting) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.executes, c.frames, c.dials, c.provisions = 0, 0, 0, 0
	c.markers = map[string]int{}
	c.returned = map[string]int{}
	c.frameOps = map[string]int{}
	c.commands = nil
}

// frame records one complete line written on a stream.
func (c *counting) frame(line []byte) {
	var f struct {
		Op string `json:"op"`
	}
	json.Unmarshal(line, &f)
	c.mu.Lock()
	if f.Op != "auth" { // the handshake is per connection, not per cell
		c.frames++
	}
	c.frameOps[f.Op]++
	c.mu.Unlock()
}

// countingStreams is a Counting over an Env that offers streams.
type countingStreams struct {
	*counting
	dialer backends.StreamDialer
}

func (c *countingStreams) DialUnix(ctx context.Context, path string) (net.Conn, error) {
	c.mu.Lock()
	c.dials++
	c.mu.Unlock()
	conn, err := c.dialer.DialUnix(ctx, path)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, c: c.counting}, nil
}

// countingConn counts the '\n'-terminated lines written on a stream.
type countingConn struct {
	net.Conn
	c *counting

	mu      sync.Mutex
	partial []byte
}

func (cc *countingConn) Write(p []byte) (int, error) {
	n, err := cc.Conn.Write(p)
	cc.mu.Lock()
	data := p[:n]
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			cc.partial = append(cc.partial, data...)
			break
		}
		line := append(cc.partial, data[:i]...)
		cc.partial = nil
		cc.c.frame(line)
		data = data[i+1:]
	}
	cc.mu.Unlock()
	return n, err
}
