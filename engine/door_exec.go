package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

// The door every backend has: plain Execute of cell scripts (scripts.go),
// one round trip per wait window, tool calls carried by the round trips.

// execDoor runs one cell over plain Execute, the door every backend has:
// each round trip is a cell script that publishes the cell (or delivers
// tool answers), then waits on the host for the result or the cell's tool
// requests, which the next round trip answers.
type execDoor struct {
	e *Engine
	k *Kernel
	c *cellRun
}

// run publishes the cell and waits for it: one round trip when the cell
// finishes within one wait window.
func (x *execDoor) run(ctx context.Context) outcome {
	e, k, c := x.e, x.k, x.c
	e.mu.Lock()
	dir, pid, token := k.dir, k.pid, k.token
	e.mu.Unlock()
	publish := true
	var answers []rpcAnswer
	// Answers of calls still running, or lost with a broken stream, now go
	// the Execute way as soon as they exist.
	c.rpc.streamBroke(func(a rpcAnswer) error { return x.deliver(ctx, dir, []rpcAnswer{a}) })
	backoff := 100 * time.Millisecond
	failures, lastErr := 0, ""
	for {
		now := time.Now()
		var window time.Duration
		if !c.interrupted && !now.Before(c.deadline) {
			c.interrupted, c.graceEnd = true, now.Add(e.cfg.InterruptGrace)
			e.emit(cellEvent(EventCellTimeout, k, c.id, "cell "+c.id+": interrupting"))
		}
		ring := c.interrupted && !c.interruptSent
		if c.interrupted {
			window = c.graceEnd.Sub(now)
			if window <= 0 && failures > 0 {
				// The host has not answered since the stream broke: say so
				// rather than claim a kill that could not be sent.
				return outcome{kind: outUnreachable, detail: lastErr}
			}
			if window <= 0 {
				return outcome{kind: outTimeoutKilled, interrupted: true}
			}
		} else {
			window = min(c.deadline.Sub(now), e.cfg.WaitWindow)
		}
		secs := max(1, int(math.Ceil(window.Seconds())))
		opts := backends.ExecOptions{Timeout: time.Duration(secs)*time.Second + 10*time.Second}
		answers = append(answers, c.rpc.takeUnsent()...)
		if publish && len(answers) > 0 {
			// The stream broke with answers undelivered; this call's stdin
			// is the request, so they go on their own now, in one round trip.
			if err := x.deliver(ctx, dir, answers); err != nil {
				e.emit(kernelEvent(EventTransportError, k, err.Error()))
			}
			answers = nil
		}
		sendAnswers := !publish && len(answers) > 0
		switch {
		case publish:
			// The request file's JSON, made only for this door.
			req, _ := json.Marshal(cellFrame{ID: c.id, Code: c.code, Timeout: c.timeoutSec, Place: c.place})
			opts.Stdin = signed(token, kernelauth.Request, req)
		case sendAnswers:
			opts.Stdin = encodeAnswers(token, answers)
		}
		res, err := k.env.Execute(ctx, cellScript(dir, c.id, pid, secs, publish, ring, sendAnswers,
			kernelauth.MAC(token, kernelauth.Interrupt, c.id)), opts)
		if err != nil {
			if ctx.Err() != nil {
				return outcome{kind: outCanceled, detail: ctx.Err().Error()}
			}
			if errors.Is(err, backends.ErrHostGone) {
				// Its container was removed or stopped: nothing more will
				// answer. A cell never handed over is safe to run again.
				if c.mayHaveRun(false) {
					return outcome{kind: outLost, detail: err.Error()}
				}
				return outcome{kind: outDead}
			}
			if publish {
				c.reached(reachRecord)
			}
			failures, lastErr = failures+1, err.Error()
			e.emit(kernelEvent(EventTransportError, k, err.Error()))
			if time.Now().After(c.deadline.Add(e.cfg.InterruptGrace)) {
				return outcome{kind: outUnreachable, detail: err.Error()}
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return outcome{kind: outCanceled, detail: ctx.Err().Error()}
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		if failures > 0 {
			e.emit(kernelEvent(EventReconnected, k, fmt.Sprintf("host answered again after %d failed attempts", failures)))
			failures = 0
		}
		if ring && strings.Contains(res.Output, markerPrefix) {
			c.interruptSent = true
		}
		if sendAnswers && strings.Contains(res.Output, markerPrefix) {
			answers = nil // written on the host (a retry would write them again, harmlessly)
		}
		if line, ok := findLine(res.Output, markResult); ok {
			mac, body, _ := strings.Cut(line, " ")
			if !kernelauth.Valid(token, mac, kernelauth.Result, body) {
				// Not the runner's: it is not believed, and the runner's own
				// result (or its death) is what the cell waits for.
				return outcome{kind: outLost, detail: "malformed result from the runner: not signed with the kernel's secret"}
			}
			var f runnerFrame
			if err := json.Unmarshal([]byte(body), &f); err != nil || f.ID != c.id {
				return outcome{kind: outLost, detail: fmt.Sprintf("malformed result from the runner: %.200q", body)}
			}
			return outcome{kind: outDone, frame: &f, interrupted: c.interrupted}
		}
		switch {
		case hasLine(res.Output, markRPCWait):
			if publish {
				c.reached(reachRecord)
			}
			publish = false
			// Tool calls: answer them in the next round trip, which also
			// goes on waiting for the result.
			answers = append(answers, x.toolCalls(rpcItemsFromOutput(res.Output), func(a rpcAnswer) error {
				return x.deliver(ctx, dir, []rpcAnswer{a})
			})...)
		case hasLine(res.Output, markPending):
			if publish {
				c.reached(reachRecord)
			}
			publish = false
		case hasLine(res.Output, markDead):
			// The runner is dead and the .req record is absent: it never
			// ran, unless the cell went over its socket (which writes no
			// record), where it may have.
			if c.mayHaveRun(true) {
				return outcome{kind: outLost, detail: "the runner died during the cell" + exitCause(res.Output, markDead)}
			}
			return outcome{kind: outDead, detail: exitCause(res.Output, markDead)}
		case hasLine(res.Output, markGone):
			// The runner's watcher removes the dir when the runner ends,
			// after keeping its exit status: with it known, say that instead.
			cause := exitCause(res.Output, markGone)
			if c.mayHaveRun(false) {
				if cause != "" {
					return outcome{kind: outLost, detail: "the runner ended" + cause}
				}
				return outcome{kind: outLost, detail: "the kernel dir is gone"}
			}
			return outcome{kind: outDead, detail: cause}
		case hasLine(res.Output, markLost):
			return outcome{kind: outLost, detail: "the runner died during the cell" + exitCause(res.Output, markLost)}
		case hasLine(res.Output, markPubFail):
			detail := strings.TrimSpace(strings.ReplaceAll(redactRPC(res.Output), string(markPubFail), ""))
			if c.mayHaveRun(true) {
				// It went over the socket first and may have run.
				return outcome{kind: outLost, detail: "the cell's record could not be written after its socket broke: " + detail}
			}
			return outcome{kind: outPubFail, detail: detail}
		default:
			return outcome{kind: outLost, detail: "unexpected answer from the host: " + hostError(res)}
		}
	}
}

// deliver writes tool-call answers into the kernel's rpc/ dir in their own
// round trip, for answers that were not ready when the cell script went
// back to waiting, or that a broken stream may have lost.
func (x *execDoor) deliver(ctx context.Context, dir string, answers []rpcAnswer) error {
	e, k := x.e, x.k
	e.mu.Lock()
	token := k.token
	e.mu.Unlock()
	res, err := k.env.Execute(ctx, answerScript(dir), backends.ExecOptions{Stdin: encodeAnswers(token, answers), Timeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("deliver %d tool answer(s) to kernel %s: %w", len(answers), dir, err)
	}
	if !hasLine(res.Output, markOK) {
		return fmt.Errorf("deliver %d tool answer(s) to kernel %s: %s", len(answers), dir, hostError(res))
	}
	return nil
}

// rpcGather is how long the Execute door waits for answers so that they
// travel with the next wait on the host; answers that take longer (slow
// tools, approvals) are delivered on their own by deliver.
const rpcGather = 100 * time.Millisecond

// toolCalls serves the requests a cell script collected and returns the
// answers ready within rpcGather; the others go by deliver once ready.
func (x *execDoor) toolCalls(items []rpcItem, deliver func(rpcAnswer) error) []rpcAnswer {
	s := x.c.rpc
	var mu sync.Mutex
	var ready []rpcAnswer
	gathering, pending := true, len(items)
	all := make(chan struct{})
	if pending == 0 {
		close(all)
	}
	for _, it := range items {
		s.serveThen(it, func(a *rpcAnswer) {
			mu.Lock()
			if gathering {
				if a != nil {
					ready = append(ready, *a)
				}
				if pending--; pending == 0 {
					close(all)
				}
				mu.Unlock()
				return
			}
			mu.Unlock()
			if a != nil && s.ctx.Err() == nil && deliver(*a) != nil {
				s.undelivered(*a)
			}
		})
	}
	timer := time.NewTimer(rpcGather)
	defer timer.Stop()
	select {
	case <-all:
	case <-timer.C:
	}
	mu.Lock()
	defer mu.Unlock()
	gathering = false
	return ready
}

// encodeAnswers renders answers for the cell script's stdin: one line per
// answer, "SEQ MAC JSON", the MAC under the kernel's token.
func encodeAnswers(token string, answers []rpcAnswer) []byte {
	var b bytes.Buffer
	for _, a := range answers {
		line, err := json.Marshal(a.resp)
		if err != nil {
			line, _ = json.Marshal(rpcResponse{Error: "the tool's result could not be encoded: " + err.Error()})
		}
		seq := strconv.FormatInt(a.seq, 10)
		fmt.Fprintf(&b, "%s %s %s\n", seq, kernelauth.MAC(token, kernelauth.Answer, seq, string(line)), line)
	}
	return b.Bytes()
}

// rpcItemsFromOutput collects the request files a cell script printed:
// "KD:RPC NAME JSON" or "KD:RPCBAD NAME REASON".
func rpcItemsFromOutput(output string) []rpcItem {
	var items []rpcItem
	for line := range strings.SplitSeq(output, "\n") {
		line = strings.TrimRight(line, "\r")
		if rest, ok := strings.CutPrefix(line, string(markRPC)+" "); ok {
			name, data, _ := strings.Cut(rest, " ")
			items = append(items, rpcItem{name: name, data: []byte(data)})
		} else if rest, ok := strings.CutPrefix(line, string(markRPCBad)+" "); ok {
			name, why, _ := strings.Cut(rest, " ")
			items = append(items, rpcItem{name: name, problem: strings.ReplaceAll(why, "-", " ")})
		}
	}
	return items
}
