package engine

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine/runner"
)

// A spawn that ships runner.py makes the host's Python compile it: about
// 8 ms, and some 3 MB the compiler's work leaves in the runner's heap for
// its whole life. So the engine has each configured backend's interpreter
// compile the runner once, in a process of its own that runs nothing of
// the host's packages, keeps the result in its own memory (never in a file
// a kernel could change for the next one) and ships it with later spawns
// behind runner.Loader. Where spares are kept, the python3 on PATH compiles
// it before the first spare starts (python ""), so that the kernels of the
// engine's first moments do not run from source either, and its code
// serves the interpreter the first spawn reports if that is the one it ran;
// elsewhere the compile waits for the interpreter the first spawn reports.

// maxRunnerCode bounds the compiled runner a host may send back (it is
// about 110 KB).
const maxRunnerCode = 4 << 20

// errNoCode is a spawn whose loader refused the shipped code: the host's
// interpreter is not the one that compiled it.
var errNoCode = errors.New("the interpreter refused the compiled runner")

// runnerCode is the runner as one host's interpreter compiled it, or the
// compile under way (code nil, done open).
type runnerCode struct {
	code []byte        // magic number, then the marshalled code object; nil if the compile failed
	exe  string        // the interpreter that compiled it (its sys.executable); "" if it did not say
	done chan struct{} // closed when the compile has ended
}

// compileWait bounds how long a spawn waits for a compile under way (it
// takes 30-60 ms): the code saves that spawn 10 ms and its kernel 3 MB for
// its whole life.
const compileWait = 2 * time.Second

func codeKey(env backends.Env, python string) string { return env.URI() + "\x00" + python }

// runnerCodes is the engine's cache of compiled runners, by codeKey, with
// a lock of its own, which also guards each entry's code and exe.
type runnerCodes struct {
	mu sync.Mutex
	m  map[string]*runnerCode
}

func newRunnerCodes() *runnerCodes { return &runnerCodes{m: map[string]*runnerCode{}} }

// get returns the entry for key, or nil.
func (rc *runnerCodes) get(key string) *runnerCode {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.m[key]
}

// forget drops the entry for key.
func (rc *runnerCodes) forget(key string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	delete(rc.m, key)
}

// claim makes the entry for key, unless there is one (ok false), and
// returns with it the entry for from, if any.
func (rc *runnerCodes) claim(key, from string) (c, fromEntry *runnerCode, ok bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.m[key] != nil {
		return nil, nil, false
	}
	c = &runnerCode{done: make(chan struct{})}
	rc.m[key] = c
	if from != "" {
		fromEntry = rc.m[from]
	}
	return c, fromEntry, true
}

// result is what c holds now: its code (nil until compiled, or if the
// compile failed) and the interpreter that made it.
func (rc *runnerCodes) result(c *runnerCode) (code []byte, exe string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return c.code, c.exe
}

// preset makes the entry for key a compile that ended with code by exe.
func (rc *runnerCodes) preset(key string, code []byte, exe string) {
	c := &runnerCode{code: code, exe: exe, done: make(chan struct{})}
	close(c.done)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.m[key] = c
}

// set stores what c's compile made.
func (rc *runnerCodes) set(c *runnerCode, code []byte, exe string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	c.code, c.exe = code, exe
}

// len counts the entries.
func (rc *runnerCodes) len() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.m)
}

// shippedRunner returns what a spawn on env with interpreter python ships
// as runner.py and runner.code: the loader and the code once python
// compiled it (waiting up to compileWait for a compile under way), else the
// source and nothing.
func (e *Engine) shippedRunner(ctx context.Context, env backends.Env, python string) (script, code []byte) {
	c := e.codes.get(codeKey(env, python))
	if c == nil {
		return runner.Source, nil
	}
	t := time.NewTimer(compileWait)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	case <-ctx.Done():
	}
	if code, _ := e.codes.result(c); code != nil {
		return runner.Loader, code
	}
	return runner.Source, nil
}

// forgetRunnerCode drops python's code on env after its loader refused it
// (the interpreter changed under the same path); the next spawn that
// learns the interpreter compiles again.
func (e *Engine) forgetRunnerCode(env backends.Env, python string) {
	e.codes.forget(codeKey(env, python))
	if path := e.runnerCachePath(env); path != "" {
		os.Remove(path)
	}
}

// compileRunner starts, in the background, python compiling the runner on
// env, once per configured backend and interpreter: hosts made for one
// kernel (a container each) would not reuse it. A compile that fails is not
// tried again; spawns there ship the source, as before.
func (e *Engine) compileRunner(env backends.Env, python string) {
	e.mu.Lock()
	if _, configured := e.env(env.URI()); e.closed || !configured {
		e.mu.Unlock()
		return
	}
	// Counted before the lock goes, so a Close that comes next waits for it.
	e.wg.Add(1)
	e.mu.Unlock()
	// Where spares are kept, the python3 on PATH compiled (or is compiling)
	// the runner already, and is most often the interpreter a spawn then
	// reports: its code is taken rather than made again.
	from := ""
	if python != "" {
		from = codeKey(env, "")
	}
	c, onPath, ok := e.codes.claim(codeKey(env, python), from)
	if !ok {
		e.wg.Done()
		return
	}
	go func() {
		defer e.wg.Done()
		defer close(c.done)
		if onPath != nil {
			<-onPath.done // a compile ends within spawnTimeout
			if code, exe := e.codes.result(onPath); code != nil && exe == python {
				e.codes.set(c, code, exe)
				e.saveRunnerCache(env, python, code)
				return
			}
		}
		// A compile whose code the next engine keeps is let finish, Close
		// waiting for it: a one-shot engine ends long before its compile.
		base := e.base
		if python != "" && e.runnerCachePath(env) != "" {
			base = context.WithoutCancel(e.base)
		}
		ctx, cancel := context.WithTimeout(base, spawnTimeout)
		defer cancel()
		code, exe, err := compileOn(ctx, env, python)
		if err != nil && e.base.Err() != nil {
			return // the engine closed: nothing to say
		}
		if err != nil {
			e.emit(Event{Type: EventNotice, Detail: fmt.Sprintf(
				"%s: every spawn there compiles the runner anew (about 10 ms more each): %v", env.URI(), err)})
			return
		}
		e.codes.set(c, code, exe)
		if python != "" && (exe == "" || exe == python) {
			e.saveRunnerCache(env, python, code)
		}
	}()
}

// compileOn runs compileScript on env and returns the code it printed and
// the interpreter's path ("" if it did not say).
func compileOn(ctx context.Context, env backends.Env, python string) (code []byte, exe string, err error) {
	res, err := env.Execute(ctx, compileScript(python), backends.ExecOptions{Stdin: runner.Source, Timeout: spawnTimeout})
	if err != nil {
		return nil, "", fmt.Errorf("compile the runner with %s on %s: %w", python, env.URI(), err)
	}
	line, ok := findLine(res.Output, markCode)
	if !ok {
		return nil, "", fmt.Errorf("compile the runner with %s on %s: %s", python, env.URI(), hostError(res))
	}
	if base64.StdEncoding.DecodedLen(len(line)) > maxRunnerCode {
		return nil, "", fmt.Errorf("compile the runner with %s on %s: %d bytes of code, more than %d", python, env.URI(), len(line), maxRunnerCode)
	}
	code, err = base64.StdEncoding.DecodeString(line)
	if err != nil || len(code) < 8 { // a magic number and some code
		return nil, "", fmt.Errorf("compile the runner with %s on %s: not the base64 of a compiled runner: %.60q", python, env.URI(), line)
	}
	if exe, ok = findLine(res.Output, markExe); !ok || !strings.HasPrefix(exe, "/") {
		exe = ""
	}
	return code, exe, nil
}
