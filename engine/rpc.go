package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/jsonobj"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

// The host side of tool calls. A kernel's call writes rpc/SEQ.req; the
// runner (fast path) or the host-side wait (plain Execute) forwards each
// request file once and removes it. Here every request is authenticated and
// checked before anything runs, and answered over the same door.

// Limits on one tool request.
const (
	// MaxToolArgs is the largest arguments object a tool call may send.
	MaxToolArgs = 1 << 20
	// maxRPCFile mirrors the runner's RPC_FILE_MAX: a request file larger
	// than this is not even read.
	maxRPCFile = MaxToolArgs + 64<<10
)

// rpcFileName is the shape of request file names the runner and the cell
// script forward (others arrive as "?").
var rpcFileName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,80}$|^\?$`)

// rpcItem is one request file as the host forwarded it: its name and either
// its content or why it could not be read.
type rpcItem struct {
	name    string
	data    []byte
	problem string
}

// rpcRequest is a parsed request file.
type rpcRequest struct {
	Seq    int64
	Tool   string
	Args   json.RawMessage // as sent; a JSON object once checked
	Token  string
	Cell   string
	args   hosttools.Args  // Args decoded, set by the check
	rawSeq json.RawMessage // seq as written, which the MAC covers
}

// rpcResponse is the answer a kernel's call receives.
type rpcResponse struct {
	OK      bool                    `json:"ok"`
	Value   any                     `json:"value,omitempty"`
	Text    string                  `json:"text,omitempty"`
	Note    string                  `json:"note,omitempty"`
	Dropped []string                `json:"dropped,omitempty"`
	Stored  *hosttools.StoredOutput `json:"stored,omitempty"`
	Error   string                  `json:"error,omitempty"`
}

// rejection is a request that is reported and never dispatched. seq is set
// when the request was authenticated and carried a fresh seq, so that the
// calling kernel can be told why instead of waiting for its timeout.
type rejection struct {
	reason string
	seq    int64
}

func (r *rejection) Error() string { return r.reason }

// parseRPCRequest parses one request file. It accepts exactly the fields the
// runner writes; seq must be a positive JSON integer, args a JSON object.
func parseRPCRequest(data []byte) (rpcRequest, error) {
	// Strict decoding: exact keys, each once. A struct decoder would take
	// "TOKEN" for "token", and a map keeps the last of two "token"s, so two
	// readers of one file could see two different requests.
	obj, err := jsonobj.Decode(data)
	if err != nil {
		return rpcRequest{}, fmt.Errorf("unparseable request: %w", err)
	}
	var req rpcRequest
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		raw := obj[key]
		var dst *string
		switch key {
		case "token":
			dst = &req.Token
		case "cell":
			dst = &req.Cell
		case "tool":
			dst = &req.Tool
		case "seq", "args":
			continue
		default:
			return rpcRequest{}, fmt.Errorf("unparseable request: unknown field %.40q", key)
		}
		if string(raw) == "null" {
			continue
		}
		if raw[0] != '"' {
			return rpcRequest{}, fmt.Errorf("unparseable request: %s must be a string", key)
		}
		if *dst, err = jsonobj.Unquote(raw); err != nil {
			return rpcRequest{}, fmt.Errorf("unparseable request: %s must be a string", key)
		}
	}
	req.Args = obj["args"]
	req.rawSeq = obj["seq"]
	seq, err := parseSeq(obj["seq"])
	if err != nil {
		return req, err
	}
	req.Seq = seq
	return req, nil
}

// errSeq marks a seq that is missing or not a positive integer.
var errSeq = errors.New("seq")

func parseSeq(raw json.RawMessage) (int64, error) {
	s := string(bytes.TrimSpace(raw))
	if s == "" {
		return 0, fmt.Errorf("%w is missing", errSeq)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%w %.40s is not a positive integer", errSeq, s)
	}
	return n, nil
}

// rpcSession serves the tool calls of one cell: it knows the cell's
// authority (its id and its kernel's token) and counts its calls.
type rpcSession struct {
	e      *Engine
	k      *Kernel
	cellID string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// idle hands a call to a worker that finished its last one and waits
	// for the next (a new goroutine per call cost a stack grown anew).
	idle chan rpcJob

	mu       sync.Mutex
	made     int // dispatched to a tool
	reserved int // counted against max_tool_calls, dispatched or about to be
	// unsent holds answers the socket could not deliver, for the Execute door.
	unsent []rpcAnswer
	// streamed are the answers sent over the current stream: a stream that
	// breaks may have lost them unread, so they are sent again (the runner
	// ignores an answer it already has).
	streamed []rpcAnswer
	// late, once the Execute door runs, delivers an answer on its own
	// instead of leaving it for the next host-side wait.
	late func(rpcAnswer) error
	// onInput answers the cell's input(); nil where its caller cannot.
	onInput func(context.Context, InputRequest) (string, error)
	asking  bool // an input() waits for onInput
}

type rpcAnswer struct {
	seq  int64
	resp rpcResponse
}

// newRPCSession starts serving tool calls for cell c on k; calls end at the
// cell's deadline: a tool never runs longer than the cell that asked for it.
func (e *Engine) newRPCSession(ctx context.Context, k *Kernel, c *cellRun) *rpcSession {
	sctx, cancel := context.WithDeadline(ctx, c.deadline)
	return &rpcSession{e: e, k: k, cellID: c.id, ctx: sctx, cancel: cancel, idle: make(chan rpcJob), onInput: c.onInput}
}

// rpcJob is one request to serve and what to do with its answer.
type rpcJob struct {
	item rpcItem
	done func(*rpcAnswer)
}

// close stops calls still running (the cell is over) and waits for them.
func (s *rpcSession) close() int {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.made
}

// serve handles item and returns the answer for the kernel, if it gets one.
func (s *rpcSession) serve(item rpcItem) (rpcAnswer, bool) {
	req, err := s.authenticate(item)
	if err != nil {
		rej := &rejection{}
		if !errors.As(err, &rej) {
			rej = &rejection{reason: err.Error()}
		}
		name := item.name
		if !rpcFileName.MatchString(name) {
			name = "?" // the host forwards safe names; anything else is not quoted
		}
		s.e.emit(kernelEvent(EventRPCRejected, s.k, fmt.Sprintf("%s: %s; not dispatched", name, rej.reason)))
		if rej.seq == 0 {
			return rpcAnswer{}, false
		}
		return rpcAnswer{seq: rej.seq, resp: rpcResponse{Error: "refused by the host: " + rej.reason}}, true
	}
	resp := s.dispatch(req)
	if errors.Is(s.ctx.Err(), context.DeadlineExceeded) {
		// The cell passed its timeout while this call waited (on a tool or
		// the operator): the engine is interrupting it. An answer now would
		// race the interrupt and could end the cell as a plain error.
		return rpcAnswer{}, false
	}
	return rpcAnswer{seq: req.Seq, resp: resp}, true
}

// authenticate applies every check that decides whether a request is a call
// of this cell at all. The order matters: nothing about a request is
// trusted (not even its seq) before its token matched.
func (s *rpcSession) authenticate(item rpcItem) (rpcRequest, error) {
	if item.problem != "" {
		return rpcRequest{}, &rejection{reason: item.problem}
	}
	if len(item.data) > maxRPCFile {
		return rpcRequest{}, &rejection{reason: fmt.Sprintf("oversized: %d bytes, the limit is %d", len(item.data), maxRPCFile)}
	}
	req, err := parseRPCRequest(item.data)
	if err != nil && !errors.Is(err, errSeq) {
		return req, &rejection{reason: err.Error()}
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	// The request's token is the MAC of its fields as written, under the
	// kernel's secret: only the kernel's own runner can make one. An empty
	// secret fails closed.
	if req.Token == "" || !kernelauth.Valid(s.k.token, req.Token, kernelauth.RPC, string(req.rawSeq), req.Cell, req.Tool, string(req.Args)) {
		what := "wrong token"
		if req.Token == "" {
			what = "missing token"
		}
		return req, &rejection{reason: what}
	}
	if err != nil {
		return req, &rejection{reason: err.Error()}
	}
	if _, dup := s.k.rpcSeen[req.Seq]; dup {
		return req, &rejection{reason: fmt.Sprintf("duplicate seq %d: that call was already handled, and a request is never replayed", req.Seq)}
	}
	if s.k.rpcSeen == nil {
		s.k.rpcSeen = map[int64]struct{}{}
	}
	s.k.rpcSeen[req.Seq] = struct{}{}
	switch {
	case req.Cell != s.cellID:
		// The request's cell is not quoted: its text is the sender's.
		return req, &rejection{seq: req.Seq, reason: fmt.Sprintf("left over from an earlier cell (the running cell is %s): a call runs only under its own cell's authority", s.cellID)}
	case len(req.Args) > MaxToolArgs:
		return req, &rejection{seq: req.Seq, reason: fmt.Sprintf("oversized arguments: %d bytes, the limit is %d", len(req.Args), MaxToolArgs)}
	case !toolName.MatchString(req.Tool) && req.Tool != inputTool:
		return req, &rejection{seq: req.Seq, reason: fmt.Sprintf("tool name %.80q is not a tool name", req.Tool)}
	}
	if a := bytes.TrimSpace(req.Args); len(a) == 0 || string(a) == "null" {
		req.Args = json.RawMessage("{}")
	}
	// Args are decoded here, once: the approval prompt and the tool see the
	// same values, and a repeated key (one value shown, another run) is refused.
	args, err := jsonobj.Decode(req.Args)
	if err != nil {
		return req, &rejection{seq: req.Seq, reason: "args must be a JSON object with each parameter once: " + err.Error()}
	}
	req.args = hosttools.Args(args)
	return req, nil
}

// dispatch runs an authenticated call through the tool set, the per-cell
// limit, the approval policy and the registry.
func (s *rpcSession) dispatch(req rpcRequest) rpcResponse {
	e, k := s.e, s.k
	if req.Tool == inputTool {
		return s.ask(req)
	}
	refuse := func(why string) rpcResponse {
		e.emit(kernelEvent(EventRPCCall, k, fmt.Sprintf("seq %d %s: refused: %s", req.Seq, req.Tool, why)))
		return rpcResponse{Error: why}
	}
	tools := k.key.ToolList()
	if !slices.Contains(tools, req.Tool) {
		return refuse(fmt.Sprintf("tool %s is not in this kernel's tool set [%s]; run the cell in a kernel whose tools include it",
			req.Tool, strings.Join(tools, ", ")))
	}
	if e.cfg.Tools == nil {
		return refuse("no host tools are configured in this kerneldeck")
	}
	if _, ok := e.cfg.Tools.Lookup(req.Tool); !ok {
		return refuse(fmt.Sprintf("the host has no tool %s (it has: %s)", req.Tool, strings.Join(e.cfg.Tools.Names(), ", ")))
	}
	limit := max(e.cfg.MaxToolCalls, 0)
	s.mu.Lock()
	if s.reserved >= limit {
		s.mu.Unlock()
		return refuse(fmt.Sprintf("limit reached: a cell may make at most %d tool calls (max_tool_calls)", limit))
	}
	s.reserved++
	s.mu.Unlock()
	unreserve := func() {
		s.mu.Lock()
		s.reserved--
		s.mu.Unlock()
	}
	if err := e.authorize(s.ctx, k, req.Tool, req.args); err != nil {
		unreserve()
		return refuse(err.Error())
	}
	args := req.args
	s.mu.Lock()
	s.made++
	s.mu.Unlock()
	e.mu.Lock()
	kernelID := k.id
	e.mu.Unlock()
	call := hosttools.Call{Owner: k.key.Owner, KernelID: kernelID, Tool: req.Tool, Args: args}
	start := time.Now()
	res, err := e.cfg.Tools.Dispatch(s.ctx, call)
	took := time.Since(start)
	if err == nil && e.cfg.ToolOutput != nil {
		res, err = e.cfg.ToolOutput.Offload(call, res)
	}
	if err != nil {
		e.emit(kernelEvent(EventRPCCall, k, fmt.Sprintf("seq %d %s: error in %s: %s", req.Seq, req.Tool, english.Duration(took), err)))
		return rpcResponse{Error: err.Error()}
	}
	e.emit(kernelEvent(EventRPCCall, k, fmt.Sprintf("seq %d %s: ok in %s", req.Seq, req.Tool, english.Duration(took))))
	return rpcResponse{OK: true, Value: res.Value, Text: res.Text, Note: res.Note, Dropped: res.Dropped, Stored: res.Stored}
}

// sentOnStream records an answer written on the stream: a stream that
// breaks may lose it unread (see streamBroke).
func (s *rpcSession) sentOnStream(a rpcAnswer) {
	s.mu.Lock()
	s.streamed = append(s.streamed, a)
	s.mu.Unlock()
}

// undelivered delivers a on its own once the Execute door runs, or keeps it
// for the Execute door's next round trip.
func (s *rpcSession) undelivered(a rpcAnswer) {
	s.mu.Lock()
	late := s.late
	s.mu.Unlock()
	if late != nil && s.ctx.Err() == nil && late(a) == nil {
		return
	}
	s.mu.Lock()
	s.unsent = append(s.unsent, a)
	s.mu.Unlock()
}

// streamBroke is called when the stream ended before the cell's result:
// answers sent on it may never have been read, so they are sent again, and
// from now on late answers are delivered by late.
func (s *rpcSession) streamBroke(late func(rpcAnswer) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unsent = append(s.streamed, s.unsent...)
	s.streamed = nil
	s.late = late
}

// serveThen handles item in the background and then calls done with its
// answer, or nil when it gets none. Calls run at once and side by side (a
// slow tool never holds up another): an idle worker takes the call, else a
// new one starts.
func (s *rpcSession) serveThen(item rpcItem, done func(*rpcAnswer)) {
	s.wg.Add(1)
	job := rpcJob{item: item, done: done}
	select {
	case s.idle <- job:
	default:
		go s.work(job)
	}
}

// work serves job, then the jobs handed to it while it waits idle, until
// the session closes.
func (s *rpcSession) work(job rpcJob) {
	for {
		if ans, ok := s.serve(job.item); ok {
			job.done(&ans)
		} else {
			job.done(nil)
		}
		s.wg.Done()
		select {
		case job = <-s.idle:
		case <-s.ctx.Done():
			return
		}
	}
}

// takeUnsent returns the answers waiting for the Execute door.
func (s *rpcSession) takeUnsent() []rpcAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.unsent
	s.unsent = nil
	return out
}

// signed is body as a runner reads a signed file: "MAC BODY".
func signed(token string, kind kernelauth.Kind, body []byte) []byte {
	return append([]byte(kernelauth.MAC(token, kind, string(body))+" "), body...)
}

// pyKeywords cannot be function names in the generated module.
var pyKeywords = map[string]bool{
	"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true, "async": true,
	"await": true, "break": true, "class": true, "continue": true, "def": true, "del": true, "elif": true,
	"else": true, "except": true, "finally": true, "for": true, "from": true, "global": true, "if": true,
	"import": true, "in": true, "is": true, "lambda": true, "nonlocal": true, "not": true, "or": true,
	"pass": true, "raise": true, "return": true, "try": true, "while": true, "with": true, "yield": true,
}

// toolModule generates kerneldeck_tools.py for a tool set: one function per
// tool (with the registry's parameters when it knows the tool) and call().
func toolModule(tools []string, reg *hosttools.Registry) []byte {
	var b strings.Builder
	b.WriteString(`"""Host tools this kernel may call (generated by kerneldeck at spawn).

Each function sends one request to the kerneldeck host, which checks it,
asks the operator when its policy says so, and runs the tool there. A
refused or failed call raises ToolError; a call the host does not answer in
time raises ToolTimeout. Notes from the host (clipped or stored output) go
to stderr; last_result holds the host's whole answer to the latest call.
"""

import sys as _sys

TOOLS = (`)
	for _, t := range tools {
		fmt.Fprintf(&b, "%q, ", t)
	}
	b.WriteString(`)
last_result = None


class ToolError(Exception):
    """A tool call was refused or failed; the message says why."""


class ToolTimeout(ToolError, TimeoutError):
    """The host did not answer a tool call in time."""


def _call(name, args):
    global last_result
    runtime = _sys.modules.get("kerneldeck_runtime")
    if runtime is None:
        raise ToolError("kerneldeck_tools works only inside a kerneldeck kernel")
    try:
        res = runtime.call(name, args)
    except TimeoutError as e:
        raise ToolTimeout(str(e)) from None
    last_result = res
    if not res.get("ok"):
        raise ToolError("%s: %s" % (name, res.get("error") or "failed"))
    if res.get("note"):
        print("kerneldeck_tools: %s: %s" % (name, res["note"]), file=_sys.stderr)
    return res["value"] if "value" in res else res.get("text", "")


def call(name, **args):
    """Call the host tool name with keyword arguments; returns its result."""
    return _call(name, args)
`)
	for _, t := range tools {
		if pyKeywords[t] || t == "call" || strings.HasPrefix(t, "_") {
			continue // reachable through call() only
		}
		var params hosttools.Schema
		desc := "Call the host tool " + t + "."
		if reg != nil {
			if tool, ok := reg.Lookup(t); ok {
				params, desc = tool.Params, tool.Description
			}
		}
		var sig, body []string
		for _, p := range params {
			if pyKeywords[p.Name] || p.Name == "extra" || p.Name == "args" {
				continue // passed through **extra
			}
			if p.Required {
				sig = append(sig, p.Name)
				body = append(body, fmt.Sprintf("    args[%q] = %s\n", p.Name, p.Name))
			}
		}
		for _, p := range params {
			if pyKeywords[p.Name] || p.Name == "extra" || p.Name == "args" || p.Required {
				continue
			}
			sig = append(sig, p.Name+"=None")
			body = append(body, fmt.Sprintf("    if %s is not None:\n        args[%q] = %s\n", p.Name, p.Name, p.Name))
		}
		sig = append(sig, "**extra")
		fmt.Fprintf(&b, "\n\ndef %s(%s):\n    %s\n    args = dict(extra)\n%s    return _call(%q, args)\n",
			t, strings.Join(sig, ", "), pyDocstring(desc), strings.Join(body, ""), t)
	}
	return []byte(b.String())
}

// pyDocstring quotes s as a one-line Python docstring.
func pyDocstring(s string) string {
	q, _ := json.Marshal(strings.ReplaceAll(s, "\n", " "))
	return string(q)
}
