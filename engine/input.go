package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

// inputTool is what a cell's input() and getpass() call over the tool-call
// channel. It is not a tool name (toolName refuses the colon), so no host
// tool can be called by it, nor can it be put in a kernel's tool set.
const inputTool = "kerneldeck:input"

// Bounds on an input request: its prompt goes into an operator's terminal,
// and its answer into the kernel.
const (
	maxInputPrompt = 1024
	// MaxInputAnswer bounds what one input() gets back.
	MaxInputAnswer = 64 << 10
)

// InputRequest is a cell's input() or getpass(): Prompt is its prompt as a
// single line a terminal shows as text, Password says that what is typed
// must not be shown.
type InputRequest struct {
	Cell     string
	Prompt   string
	Password bool
}

// ErrNoInput is a cell that asked for input where its caller cannot answer
// (no OnInput); the cell's input() raises EOFError with the message.
var ErrNoInput = errors.New("input() has no one to answer it here: this caller runs cells without a prompt; give the value in the code instead")

// ErrInputEOF is the answer that ends input, as ctrl+d does at a terminal:
// the cell's input() raises EOFError.
var ErrInputEOF = errors.New("EOF when reading a line")

// ask serves an input request of the cell: it asks the caller's OnInput and
// returns the answer for the runner (the typed line as value, or an error
// its input() raises as EOFError).
func (s *rpcSession) ask(req rpcRequest) rpcResponse {
	e, k := s.e, s.k
	ask := InputRequest{Cell: s.cellID}
	var prompt string
	if json.Unmarshal(req.args["prompt"], &prompt) == nil {
		ask.Prompt = termtext.Line(prompt)
	}
	if len(ask.Prompt) > maxInputPrompt {
		cut := maxInputPrompt
		for cut > 0 && !utf8.RuneStart(ask.Prompt[cut]) {
			cut--
		}
		ask.Prompt = ask.Prompt[:cut] + "…"
	}
	_ = json.Unmarshal(req.args["password"], &ask.Password)
	what := "input()"
	if ask.Password {
		what = "getpass()"
	}
	if s.onInput == nil {
		e.emit(kernelEvent(EventRPCCall, k, fmt.Sprintf("seq %d %s: no one to ask", req.Seq, what)))
		return rpcResponse{Error: ErrNoInput.Error()}
	}
	// One question at a time: a cell's threads cannot queue up prompts
	// for the operator.
	s.mu.Lock()
	busy := s.asking
	s.asking = true
	s.mu.Unlock()
	if busy {
		e.emit(kernelEvent(EventRPCCall, k, fmt.Sprintf("seq %d %s: refused, another input() of the cell waits", req.Seq, what)))
		return rpcResponse{Error: "another input() of this cell waits for its answer; ask one at a time"}
	}
	defer func() {
		s.mu.Lock()
		s.asking = false
		s.mu.Unlock()
	}()
	e.emit(kernelEvent(EventRPCCall, k, fmt.Sprintf("seq %d %s: asked the caller", req.Seq, what)))
	start := time.Now()
	value, err := s.onInput(s.ctx, ask)
	took := english.Duration(time.Since(start))
	switch {
	case err == nil && len(value) > MaxInputAnswer:
		err = fmt.Errorf("the answer is %d bytes; input() takes at most %d", len(value), MaxInputAnswer)
	case err == nil && !utf8.ValidString(value):
		err = errors.New("the answer is not valid UTF-8")
	case err != nil && s.ctx.Err() != nil:
		err = fmt.Errorf("no answer before the cell's timeout: %w", err)
	}
	if err != nil {
		// The answer is never in an event: it may be a password.
		e.emit(kernelEvent(EventRPCCall, k, fmt.Sprintf("seq %d %s: no answer after %s: %s", req.Seq, what, took, err)))
		return rpcResponse{Error: err.Error()}
	}
	e.emit(kernelEvent(EventRPCCall, k, fmt.Sprintf("seq %d %s: answered in %s", req.Seq, what, took)))
	return rpcResponse{OK: true, Value: value}
}
