package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
)

// tb lets the bench use the repo's test helpers (internal/sshdtest,
// internal/backendtest) outside a test binary. It implements every method of
// testing.TB; the embedded nil interface only supplies TB's unexported
// method and is never called. Fatal and Skip abort the phase that called
// them by panicking with an abort, which guard turns into an error or a
// skip; Cleanup functions run, last registered first, when close is called.
type tb struct {
	testing.TB
	name string
	log  io.Writer

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	skipped  bool
	errs     []string
}

// abort is what Fatal and Skip panic with.
type abort struct {
	skip bool
	msg  string
}

func newTB(name string, log io.Writer) *tb { return &tb{name: name, log: log} }

// guard runs f and turns a Fatal or Skip inside it into a returned error
// (skip reports which). Any other panic propagates.
func guard(f func()) (err error, skip bool) {
	defer func() {
		if r := recover(); r != nil {
			a, ok := r.(abort)
			if !ok {
				panic(r)
			}
			err, skip = fmt.Errorf("%s", a.msg), a.skip
		}
	}()
	f()
	return nil, false
}

// close runs the cleanups and returns the errors reported through Error(f)
// during them or before.
func (t *tb) close() error {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		if err, _ := guard(f); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.errs) > 0 {
		return fmt.Errorf("%s", strings.Join(t.errs, "; "))
	}
	return nil
}

func (t *tb) ArtifactDir() string      { return t.TempDir() }
func (t *tb) Attr(key, value string)   {}
func (t *tb) Helper()                  {}
func (t *tb) Name() string             { return t.name }
func (t *tb) Context() context.Context { return context.Background() }
func (t *tb) Output() io.Writer        { return t.log }
func (t *tb) Chdir(dir string)         { t.Fatalf("bench: Chdir is not supported") }

func (t *tb) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *tb) Setenv(key, value string) {
	old, had := os.LookupEnv(key)
	os.Setenv(key, value)
	t.Cleanup(func() {
		if had {
			os.Setenv(key, old)
		} else {
			os.Unsetenv(key)
		}
	})
}

func (t *tb) Log(args ...any)                 { fmt.Fprintln(t.log, args...) }
func (t *tb) Logf(format string, args ...any) { fmt.Fprintf(t.log, format+"\n", args...) }

func (t *tb) Fail() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
}

func (t *tb) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *tb) Error(args ...any) { t.Errorf("%s", fmt.Sprint(args...)) }

func (t *tb) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	t.mu.Lock()
	t.failed = true
	t.errs = append(t.errs, msg)
	t.mu.Unlock()
}

func (t *tb) FailNow() { t.Fatalf("failed") }

func (t *tb) Fatal(args ...any) { t.Fatalf("%s", fmt.Sprint(args...)) }

func (t *tb) Fatalf(format string, args ...any) {
	t.Fail()
	panic(abort{msg: fmt.Sprintf(format, args...)})
}

func (t *tb) Skip(args ...any) { t.Skipf("%s", fmt.Sprint(args...)) }
func (t *tb) SkipNow()         { t.Skipf("skipped") }

func (t *tb) Skipf(format string, args ...any) {
	t.mu.Lock()
	t.skipped = true
	t.mu.Unlock()
	panic(abort{skip: true, msg: fmt.Sprintf(format, args...)})
}

func (t *tb) Skipped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.skipped
}

func (t *tb) TempDir() string {
	dir, err := os.MkdirTemp("", "kdbench-")
	if err != nil {
		t.Fatalf("bench: temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
