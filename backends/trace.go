package backends

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// Tracer appends one JSON line per backend command to an owner-only file, so
// an operator can see exactly what runs on each host. It never records stdin.
type Tracer struct {
	mu sync.Mutex
	f  *os.File
}

// TraceRecord is one line of the trace file.
type TraceRecord struct {
	Time    time.Time `json:"time"`
	Backend string    `json:"backend"`
	Command string    `json:"command"`
	RC      int       `json:"rc"`
	MS      float64   `json:"ms"`
	Error   string    `json:"error,omitempty"`
}

// OpenTracer opens path for appending, creating it with mode 0600. An existing
// file that others can read, or that is not a regular file, is refused.
func OpenTracer(path string) (*Tracer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|openPrivateFlags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open trace file %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat trace file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 {
		f.Close()
		return nil, fmt.Errorf("trace file %s has mode %v; it must be a regular file with mode 0600 (chmod 600 it or pick a new path)", path, st.Mode())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() {
		f.Close()
		return nil, fmt.Errorf("trace file %s belongs to another user; it must be yours (pick a new path)", path)
	}
	return &Tracer{f: f}, nil
}

// Record appends one line. Errors writing the trace are ignored: tracing must
// never fail a cell.
func (t *Tracer) Record(r TraceRecord) {
	if t == nil {
		return
	}
	line, err := json.Marshal(r)
	if err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.f.Write(append(line, '\n'))
}

// Close closes the trace file.
func (t *Tracer) Close() error {
	if t == nil {
		return nil
	}
	return t.f.Close()
}

// Traced returns env with every Execute recorded in t, including those on
// the hosts env provisions for kernels.
func Traced(env Env, t *Tracer) Env {
	if t == nil {
		return env
	}
	if p, ok := Find[Provisioner](env); ok {
		return &tracedProvisioner{traced: &traced{inner: env, t: t}, p: p}
	}
	return &traced{inner: env, t: t}
}

// tracedProvisioner is a traced provisioning backend: the hosts it makes
// are traced too.
type tracedProvisioner struct {
	*traced
	p Provisioner
}

func (e *tracedProvisioner) Provision(ctx context.Context, key string) (Env, error) {
	env, err := e.p.Provision(ctx, key)
	if err != nil {
		return nil, err
	}
	return Traced(env, e.t), nil
}

type traced struct {
	inner Env
	t     *Tracer
}

func (e *traced) Unwrap() Env     { return e.inner }
func (e *traced) TempDir() string { return e.inner.TempDir() }
func (e *traced) URI() string     { return e.inner.URI() }

func (e *traced) Execute(ctx context.Context, command string, opts ExecOptions) (Result, error) {
	start := time.Now()
	res, err := e.inner.Execute(ctx, command, opts)
	rec := TraceRecord{Time: start, Backend: e.inner.URI(), Command: command, RC: res.ReturnCode,
		MS: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		rec.RC = -1
		rec.Error = err.Error()
	}
	e.t.Record(rec)
	return res, err
}
