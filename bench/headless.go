package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kerneldeck/kerneldeck/wire"
)

// headlessSubject is kerneldeck as an agent uses it: one `kerneldeck
// headless` process on one backend, driven over its stdin and stdout. Its
// warm cells run in owner "warm"'s kernel; a cold start is a new owner's
// first result (with a pool, handed a spare: it first waits until the
// engine lists one), whose kernel is shut down after the timing.
type headlessSubject struct {
	name  string
	spare bool
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	seq   int
	pid   int // the warm kernel's runner
}

func (h *headlessSubject) key() string              { return h.name }
func (h *headlessSubject) cpuRoots() []int          { return nil }
func (h *headlessSubject) trips() (tripCount, bool) { return tripCount{}, false }
func (h *headlessSubject) call(req map[string]any) (json.RawMessage, error) {
	h.seq++
	id := strconv.Itoa(h.seq)
	req["id"] = id
	line, _ := json.Marshal(req)
	if _, err := h.in.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("%s: write a request: %w", h.name, err)
	}
	for {
		line, err := h.out.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("%s: read an answer: %w", h.name, err)
		}
		var head wire.Head
		if json.Unmarshal(line, &head) != nil || head.ID != id {
			continue
		}
		switch head.Op {
		case wire.OpError:
			return nil, fmt.Errorf("%s: %s", h.name, line)
		case wire.OpStarted, wire.OpOutput:
			continue
		}
		return line, nil
	}
}

// execute runs code for owner and checks it printed 1.
func (h *headlessSubject) execute(owner string) (wire.Result, error) {
	line, err := h.call(map[string]any{"op": "execute", "owner": owner, "code": "1"})
	var res wire.Result
	if err == nil {
		err = json.Unmarshal(line, &res)
	}
	if err == nil && (res.Op != wire.OpResult || res.Stdout != "1\n" || res.Kernel == nil) {
		err = fmt.Errorf("%s: the cell answered %s", h.name, line)
	}
	return res, err
}

// newHeadless starts `kerneldeck headless` on backend with spares spare
// kernels (its engine state in a dir of its own) and the warm kernel.
func newHeadless(ctx context.Context, t *tb, name, bin, backend string, spares int) (*headlessSubject, error) {
	h := &headlessSubject{name: name, spare: spares > 0}
	h.cmd = exec.CommandContext(ctx, bin, "headless", "--backend", backend, "--spare-kernels", strconv.Itoa(spares),
		"--state-dir", filepath.Join(t.TempDir(), "state"))
	h.cmd.Stderr = io.Discard
	var err error
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	h.out = bufio.NewReader(out)
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { h.in.Close(); h.cmd.Wait() })
	res, err := h.execute("warm")
	if err != nil {
		return nil, err
	}
	h.pid = res.Kernel.PID
	return h, nil
}

func (h *headlessSubject) warm(_ context.Context, n int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		res, err := h.execute("warm")
		lat = append(lat, time.Since(start))
		if err != nil {
			return lat, err
		}
		if !res.Kernel.Reused || res.Kernel.PID != h.pid {
			return lat, fmt.Errorf("%s warm cell ran in a new kernel (pid %d; warm runner pid %d)", h.name, res.Kernel.PID, h.pid)
		}
	}
	return lat, nil
}

// waitSpare waits until the engine lists a spare kernel.
func (h *headlessSubject) waitSpare() error {
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		line, err := h.call(map[string]any{"op": "kernels"})
		if err != nil {
			return err
		}
		var k wire.Kernels
		if json.Unmarshal(line, &k) == nil && k.Spares > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no spare kernel within 60 s", h.name)
		}
	}
}

// cold times a new owner's first result. With a pool it starts and ends
// with a spare ready, so that the replacement's container is not made
// while another subject is timed.
func (h *headlessSubject) cold(context.Context) (time.Duration, tripCount, error) {
	if h.spare {
		if err := h.waitSpare(); err != nil {
			return 0, tripCount{}, err
		}
	}
	owner := "cold-" + strconv.Itoa(h.seq)
	start := time.Now()
	res, err := h.execute(owner)
	d := time.Since(start)
	if err != nil {
		return d, tripCount{}, err
	}
	if res.Kernel.Reused {
		return d, tripCount{}, fmt.Errorf("%s cold start reused kernel %s", h.name, res.Kernel.ID)
	}
	if _, err := h.call(map[string]any{"op": "shutdown_owner", "owner": owner}); err != nil {
		return d, tripCount{}, err
	}
	if h.spare {
		return d, tripCount{}, h.waitSpare()
	}
	return d, tripCount{}, nil
}
