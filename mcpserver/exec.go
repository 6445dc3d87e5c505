package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/english"
)

// ExecInput are python_exec's arguments.
type ExecInput struct {
	Code     string  `json:"code" jsonschema:"Python source to run, as in a notebook cell: the kernel keeps every variable, import and definition for later calls with the same session"`
	Session  string  `json:"session,omitempty" jsonschema:"which of your persistent kernels runs it (default \"default\"); a new name starts a new kernel"`
	TimeoutS float64 `json:"timeout_s,omitempty" jsonschema:"seconds before the cell is interrupted (KeyboardInterrupt); the kernel and its state stay; default: the server's cell timeout"`
	Reset    bool    `json:"reset,omitempty" jsonschema:"start the session's kernel afresh before running the code (all earlier state is dropped)"`
}

// ExecOutput is python_exec's structured result.
type ExecOutput struct {
	Status         string  `json:"status" jsonschema:"success, error (an exception: see traceback), timeout or interrupted"`
	Stdout         string  `json:"stdout"`
	Stderr         string  `json:"stderr"`
	Traceback      string  `json:"traceback,omitempty"`
	ExecutionCount int     `json:"execution_count" jsonschema:"cells this kernel has run, this one included"`
	DurationMS     float64 `json:"duration_ms"`
	Session        string  `json:"session"`
	// Clipped output says where the whole text is.
	StdoutClipped  bool       `json:"stdout_clipped,omitempty"`
	StdoutFullPath string     `json:"stdout_full_path,omitempty" jsonschema:"file holding the whole stdout when it was clipped"`
	StderrClipped  bool       `json:"stderr_clipped,omitempty"`
	StderrFullPath string     `json:"stderr_full_path,omitempty" jsonschema:"file holding the whole stderr when it was clipped"`
	ToolCallsMade  int        `json:"tool_calls_made,omitempty"`
	Fallback       string     `json:"fallback,omitempty" jsonschema:"per_call when the kernel could not be kept and the cell ran in a one-off process"`
	Kernel         KernelInfo `json:"kernel"`
	// Displays lists the cell's rich outputs; their contents come as the
	// call's image and text content, in the same order.
	Displays    []DisplayInfo `json:"displays,omitempty" jsonschema:"the cell's rich outputs (plots, tables, HTML) in order: images are in the call's image content"`
	DisplayNote string        `json:"display_note,omitempty" jsonschema:"what of the displays was dropped or clipped"`
}

// DisplayInfo describes one display of a cell.
type DisplayInfo struct {
	MIMETypes []string          `json:"mime_types" jsonschema:"the representations the object offered"`
	Text      string            `json:"text" jsonschema:"its text/plain representation"`
	Files     map[string]string `json:"files,omitempty" jsonschema:"representations too large to return, by MIME type: the file holding each"`
	Note      string            `json:"note,omitempty"`
}

// KernelInfo says which kernel ran a cell and what happened to its state.
type KernelInfo struct {
	ID         string `json:"id"`
	Backend    string `json:"backend"`
	PID        int    `json:"pid,omitempty"`
	Reused     bool   `json:"reused" jsonschema:"true when the cell ran in the kernel earlier calls of the session used"`
	StateLost  bool   `json:"state_lost" jsonschema:"true when the session's earlier kernel is gone (reaped, evicted, killed or dead): earlier variables no longer exist"`
	StateReset bool   `json:"state_reset" jsonschema:"true when the kernel was started afresh because reset was asked"`
	// StateRestored: the kernel was parked (evicted or reaped) and its
	// state came back before this cell.
	StateRestored bool   `json:"state_restored" jsonschema:"true when the session's kernel had been evicted or reaped with its state parked, and this new kernel got that state back (note names what did not come back)"`
	Note          string `json:"note,omitempty" jsonschema:"why the state was lost, reset or restored, and what did not come back"`
}

// execution is one python_exec cell, which may outlive the MCP call that
// started it while the caller answers an approval.
type execution struct {
	owner, session string
	done           chan struct{}
	res            *engine.Result
	err            error
	approvals      chan engine.Event // the engine asks about this cell's tool calls
	inputs         chan *inputAsk    // the cell's input() asks its caller
	out            chan chunk        // output as it comes, for progress

	mu     sync.Mutex
	cell   string
	asking string // the engine's approval request put to the caller
	// answering is the input() put to the caller, who retries the call
	// with its answer.
	answering *inputAsk
}

// inputAsk is a cell's input() waiting for the caller's answer on reply.
type inputAsk struct {
	ask   engine.InputRequest
	reply chan inputReply // room for one
}

type inputReply struct {
	value string
	err   error
}

type chunk struct{ stream, text string }

func (s *Server) pythonExec(ctx context.Context, req *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	owner, err := s.ownerOf(req)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	var x *execution
	if state := req.Params.RequestState; state != "" {
		if x, err = s.resume(owner, state, req.Params.InputResponses); err != nil {
			return nil, ExecOutput{}, err
		}
	} else {
		session, err := checkSession(in.Session)
		if err != nil {
			return nil, ExecOutput{}, err
		}
		if len(in.Code) > s.opts.MaxCode {
			return nil, ExecOutput{}, fmt.Errorf("code is %d bytes; at most %d are taken: put large code in a file and exec() it", len(in.Code), s.opts.MaxCode)
		}
		if in.TimeoutS < 0 || in.TimeoutS > 7*24*3600 {
			return nil, ExecOutput{}, fmt.Errorf("timeout_s %g is out of range: give seconds between 0 (the default) and 604800", in.TimeoutS)
		}
		// Output is streamed only to a caller that asked for progress: a
		// streamed cell costs the runner frames and ticks.
		x = s.start(owner, session, in, req.Params.GetProgressToken() != nil)
	}
	return s.wait(ctx, req, x)
}

// start runs the cell on the engine, in the background of the server.
func (s *Server) start(owner, session string, in ExecInput, stream bool) *execution {
	x := &execution{owner: owner, session: session, done: make(chan struct{}),
		approvals: make(chan engine.Event, 4), inputs: make(chan *inputAsk, 1), out: make(chan chunk, 64)}
	r := engine.Request{Owner: owner, Task: session, Backend: s.opts.Backend, Tools: s.opts.Tools, Code: in.Code,
		Timeout: time.Duration(in.TimeoutS * float64(time.Second)), Reset: in.Reset,
		OnStart: func(cell string) {
			x.mu.Lock()
			x.cell = cell
			x.mu.Unlock()
			s.mu.Lock()
			s.byCell[cell] = x
			s.mu.Unlock()
		},
		// The call that waits for the cell puts its input() to the caller;
		// between calls (an answer being retried) the question waits.
		OnInput: func(ctx context.Context, ask engine.InputRequest) (string, error) {
			a := &inputAsk{ask: ask, reply: make(chan inputReply, 1)}
			select {
			case x.inputs <- a:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			select {
			case r := <-a.reply:
				return r.value, r.err
			case <-ctx.Done():
				return "", ctx.Err()
			}
		},
	}
	if stream {
		r.OnOutput = func(stream, text string) {
			select {
			case x.out <- chunk{stream, text}:
			default: // progress is best effort; the result has all of it
			}
		}
	}
	go func() {
		x.res, x.err = s.eng.Execute(s.base, r)
		x.mu.Lock()
		cell := x.cell
		x.mu.Unlock()
		s.mu.Lock()
		delete(s.byCell, cell)
		s.mu.Unlock()
		close(x.done)
		// A caller that never came back for its answer: forget the cell.
		time.AfterFunc(5*time.Minute, func() { s.forget(x) })
	}()
	return x
}

func (s *Server) forget(x *execution) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.byState {
		if v == x {
			delete(s.byState, k)
		}
	}
}

// resume takes the caller's answer to an approval it was asked.
func (s *Server) resume(owner, state string, answers mcp.InputResponseMap) (*execution, error) {
	s.mu.Lock()
	x := s.byState[state]
	if x != nil && x.owner == owner {
		delete(s.byState, state)
	}
	s.mu.Unlock()
	if x == nil || x.owner != owner {
		return nil, fmt.Errorf("requestState %.40q names no cell of yours waiting for an answer (it ended, or was answered already)", state)
	}
	x.mu.Lock()
	asking, answering := x.asking, x.answering
	x.asking, x.answering = "", nil
	x.mu.Unlock()
	if answering != nil {
		r, _ := answers[inputInput].(*mcp.ElicitResult)
		answering.reply <- replyOf(r, nil)
		return x, nil
	}
	var answer *mcp.ElicitResult
	if r, ok := answers[approvalInput].(*mcp.ElicitResult); ok {
		answer = r
	}
	s.eng.Approve(asking, decisionOf(answer)) // an answer too late is no error: the engine denied it already
	return x, nil
}

// The names of the questions a retried call answers.
const (
	approvalInput = "approval"
	inputInput    = "input"
)

// wait waits for x's result, forwarding its output as progress, putting
// its approval requests to the caller, and interrupting it if the caller
// cancels.
func (s *Server) wait(ctx context.Context, req *mcp.CallToolRequest, x *execution) (*mcp.CallToolResult, ExecOutput, error) {
	token := req.Params.GetProgressToken()
	progress := 0.0
	out := x.out
	if token == nil {
		out = nil
	}
	for {
		select {
		case <-x.done:
			return s.answer(x)
		case c := <-out:
			progress++
			req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: progress,
				Message: clipText(c.stream+": "+c.text, 4096)})
		case ev := <-x.approvals:
			caps := req.ClientCapabilities()
			if caps == nil || caps.Elicitation == nil {
				continue // the operator's dashboard or an approve request answers it, or its timeout
			}
			ask := approvalQuestion(ev)
			if req.ProtocolVersion() >= "2026-07-28" {
				// The caller retries the call with its answer (SEP-2322).
				return s.askInRetry(x, approvalInput, ask, func() { x.asking = ev.Request }), ExecOutput{}, nil
			}
			answer, err := req.Session.Elicit(ctx, ask)
			if err != nil {
				answer = nil
			}
			s.eng.Approve(ev.Request, decisionOf(answer))
		case a := <-x.inputs:
			caps := req.ClientCapabilities()
			switch {
			case a.ask.Password:
				// MCP forbids asking for secrets by form elicitation: the
				// answer would pass through the client and its logs.
				a.reply <- inputReply{err: errors.New("getpass() cannot be answered over MCP, which forbids asking for secrets by elicitation; read the secret from a file or the environment instead")}
				continue
			case caps == nil || caps.Elicitation == nil:
				a.reply <- inputReply{err: errors.New("input() needs an answer from the MCP client, which does not support elicitation; give the value in the code instead")}
				continue
			}
			ask := inputQuestion(x.session, a.ask)
			if req.ProtocolVersion() >= "2026-07-28" {
				return s.askInRetry(x, inputInput, ask, func() { x.answering = a }), ExecOutput{}, nil
			}
			a.reply <- replyOf(req.Session.Elicit(ctx, ask))
		case <-ctx.Done():
			s.interrupt(x)
			return nil, ExecOutput{}, fmt.Errorf("cancelled; the cell was interrupted and the kernel keeps its state: %w", ctx.Err())
		}
	}
}

// askInRetry ends the call with question ask, named name, for the caller to
// answer by calling again with the state it returns; mark (under x.mu)
// records what the answer is for.
func (s *Server) askInRetry(x *execution, name string, ask *mcp.ElicitParams, mark func()) *mcp.CallToolResult {
	state := "x" + randomHex(16)
	x.mu.Lock()
	mark()
	x.mu.Unlock()
	s.mu.Lock()
	s.byState[state] = x
	s.mu.Unlock()
	return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{name: ask}, RequestState: state}
}

// interrupt interrupts x's cell and waits a moment for it to end.
func (s *Server) interrupt(x *execution) {
	x.mu.Lock()
	cell := x.cell
	x.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.base, 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		select {
		case <-x.done:
			return
		default:
		}
		if k, ok := s.kernelOf(ctx, x.owner, x.session); ok && k.State == engine.StateRunning && (k.RunningCell == cell || k.RunningCell == "") {
			if s.eng.Interrupt(ctx, k.ID) == nil {
				break
			}
		}
		select {
		case <-x.done:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	select {
	case <-x.done:
	case <-ctx.Done():
	}
}

// dispatch hands each approval request of a caller's cell to that cell.
func (s *Server) dispatch(events <-chan engine.Event) {
	for {
		select {
		case <-s.base.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Type != engine.EventApprovalRequest || ev.Cell == "" {
				continue
			}
			s.mu.Lock()
			x := s.byCell[ev.Cell]
			s.mu.Unlock()
			if x != nil && x.owner == ev.Owner {
				select {
				case x.approvals <- ev:
				default:
				}
			}
		}
	}
}

// approvalQuestion is the elicitation for a tool call waiting for approval.
func approvalQuestion(ev engine.Event) *mcp.ElicitParams {
	return &mcp.ElicitParams{
		Message: fmt.Sprintf("The Python kernel wants to call the host tool %s with %s. Allow it once, always (for this tool, until the engine stops), or deny?",
			ev.Tool, clipText(string(ev.Args), 2048)),
		RequestedSchema: &jsonschema.Schema{
			Type: "object",
			Properties: map[string]*jsonschema.Schema{
				"decision": {Type: "string", Enum: []any{string(engine.ApproveOnce), string(engine.ApproveAlways), string(engine.ApproveDeny)},
					Description: "once, always or deny"},
			},
			Required: []string{"decision"},
		},
	}
}

// decisionOf reads the caller's answer; anything but an accepted once or
// always is a denial.
// inputQuestion is the elicitation for a cell's input().
func inputQuestion(session string, ask engine.InputRequest) *mcp.ElicitParams {
	return &mcp.ElicitParams{
		Message: fmt.Sprintf("The Python cell in session %s calls input() and waits for a line: %s", session, clipText(ask.Prompt, 1024)),
		RequestedSchema: &jsonschema.Schema{
			Type: "object",
			Properties: map[string]*jsonschema.Schema{
				"value": {Type: "string", Description: "the line input() returns", MaxLength: jsonschema.Ptr(engine.MaxInputAnswer)},
			},
			Required: []string{"value"},
		},
	}
}

// replyOf is input()'s answer from the caller's: the line accepted, or an
// end of input (EOFError in the cell) for a decline, a cancel or a failure.
func replyOf(r *mcp.ElicitResult, err error) inputReply {
	if err != nil || r == nil || r.Action != "accept" {
		return inputReply{err: engine.ErrInputEOF}
	}
	v, ok := r.Content["value"].(string)
	if !ok {
		return inputReply{err: errors.New("the answer to input() has no \"value\" string")}
	}
	return inputReply{value: v}
}

func decisionOf(r *mcp.ElicitResult) engine.Decision {
	if r == nil || r.Action != "accept" {
		return engine.ApproveDeny
	}
	switch d, _ := r.Content["decision"].(string); engine.Decision(d) {
	case engine.ApproveOnce:
		return engine.ApproveOnce
	case engine.ApproveAlways:
		return engine.ApproveAlways
	}
	return engine.ApproveDeny
}

// answer is the call's result from x's outcome.
func (s *Server) answer(x *execution) (*mcp.CallToolResult, ExecOutput, error) {
	if x.err != nil {
		return nil, ExecOutput{}, fmt.Errorf("session %s: %w", x.session, x.err)
	}
	r := x.res
	o := ExecOutput{Status: string(r.Status), Stdout: r.Stdout, Stderr: r.Stderr, Traceback: r.Traceback,
		DurationMS: float64(r.Duration.Microseconds()) / 1000, Session: x.session,
		StdoutClipped: r.StdoutClipped, StdoutFullPath: r.SpillPath, StderrClipped: r.StderrClipped, StderrFullPath: r.StderrSpillPath,
		ToolCallsMade: r.ToolCallsMade, Fallback: r.Fallback}
	if k := r.Kernel; k != nil {
		o.ExecutionCount = k.ExecutionCount
		o.Kernel = KernelInfo{ID: k.ID, Backend: k.Backend, PID: k.PID, Reused: k.Reused, StateLost: k.StateLost, StateReset: k.StateReset,
			StateRestored: k.StateRestored, Note: k.Note}
	}
	content := []mcp.Content{&mcp.TextContent{Text: renderExec(o)}}
	for i, d := range r.Displays {
		info, c := displayContent(i+1, d)
		o.Displays = append(o.Displays, info)
		content = append(content, c...)
	}
	o.DisplayNote = r.DisplayNote
	if len(r.Displays) > 0 {
		content[0] = &mcp.TextContent{Text: renderExec(o)}
	}
	res := &mcp.CallToolResult{Content: content, IsError: r.Status != engine.StatusSuccess}
	return res, o, nil
}

// displayContent is one display as MCP content: an image as ImageContent,
// markdown or HTML as text (markdown preferred), else its text/plain; a
// representation spilled to a file is named, not sent.
func displayContent(n int, d engine.Display) (DisplayInfo, []mcp.Content) {
	info := DisplayInfo{Text: d.Data["text/plain"], Files: d.Spill, Note: d.Note}
	for m := range d.Data {
		info.MIMETypes = append(info.MIMETypes, m)
	}
	for m := range d.Spill {
		info.MIMETypes = append(info.MIMETypes, m)
	}
	slices.Sort(info.MIMETypes)
	var out []mcp.Content
	for _, m := range []string{"image/png", "image/jpeg", "image/gif"} {
		if v, ok := d.Data[m]; ok {
			if raw, err := base64.StdEncoding.DecodeString(v); err == nil {
				out = append(out, &mcp.ImageContent{Data: raw, MIMEType: m})
				break
			}
		}
	}
	if len(out) == 0 {
		text, kind := d.Data["text/plain"], "text/plain"
		for _, m := range []string{"text/markdown", "text/html"} {
			if v, ok := d.Data[m]; ok {
				text, kind = v, m
				break
			}
		}
		out = append(out, &mcp.TextContent{Text: fmt.Sprintf("[display %d, %s]\n%s", n, kind, text)})
	}
	for m, path := range d.Spill {
		out = append(out, &mcp.TextContent{Text: fmt.Sprintf("[display %d: its %s was too large to return; it is in %s]", n, m, path)})
	}
	return info, out
}

// renderExec is the text an LLM reads: the output, then one status line.
func renderExec(o ExecOutput) string {
	var b strings.Builder
	b.WriteString(o.Stdout)
	if o.StdoutClipped {
		fmt.Fprintf(&b, "\n[stdout clipped; the whole of it is in %s]\n", o.StdoutFullPath)
	}
	if o.Stderr != "" {
		fmt.Fprintf(&b, "[stderr]\n%s", o.Stderr)
		if o.StderrClipped {
			fmt.Fprintf(&b, "\n[stderr clipped; the whole of it is in %s]\n", o.StderrFullPath)
		}
	}
	if o.Traceback != "" {
		fmt.Fprintf(&b, "[traceback]\n%s", o.Traceback)
	}
	if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "[%s · session %s · execution %d · %.1f ms · kernel %s", o.Status, o.Session, o.ExecutionCount, o.DurationMS, o.Kernel.ID)
	switch {
	case o.Kernel.StateLost:
		fmt.Fprintf(&b, " · STATE LOST: %s (earlier variables are gone)", o.Kernel.Note)
	case o.Kernel.StateReset:
		fmt.Fprintf(&b, " · reset: %s", o.Kernel.Note)
	case o.Kernel.StateRestored:
		fmt.Fprintf(&b, " · state restored: %s", o.Kernel.Note)
	case o.Kernel.Reused:
		b.WriteString(" · reused")
	default:
		b.WriteString(" · new kernel")
	}
	if o.Fallback != "" {
		fmt.Fprintf(&b, " · fallback %s: state is not kept", o.Fallback)
	}
	if n := len(o.Displays); n > 0 {
		verb := "follow"
		if n == 1 {
			verb = "follows"
		}
		fmt.Fprintf(&b, " · %s %s", english.Count(n, "display"), verb)
	}
	if o.DisplayNote != "" {
		fmt.Fprintf(&b, " · displays: %s", o.DisplayNote)
	}
	b.WriteString("]")
	return b.String()
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("... [%d bytes more]", len(s)-n)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
