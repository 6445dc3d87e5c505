package mcpserver

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/english"
)

// SessionArg names one of the caller's sessions.
type SessionArg struct {
	Session string `json:"session,omitempty" jsonschema:"the session (default \"default\")"`
}

// SessionsOutput is python_sessions' structured result.
type SessionsOutput struct {
	Owner    string        `json:"owner" jsonschema:"whose kernels these are: yours"`
	Sessions []SessionInfo `json:"sessions"`
	// Parked are sessions whose kernel was evicted or reaped with its
	// state saved: the next python_exec of the session restores it.
	Parked []ParkedSession `json:"parked"`
	// IdleExitS is how long a kernel may sit idle before it is reaped.
	IdleExitS  float64 `json:"idle_exit_s"`
	MaxKernels int     `json:"max_kernels" jsonschema:"kernels the engine keeps at once, all owners together; beyond that the least recently used idle one is evicted"`
}

// SessionInfo is one of the caller's kernels.
type SessionInfo struct {
	Session        string   `json:"session"`
	Kernel         string   `json:"kernel"`
	Backend        string   `json:"backend"`
	State          string   `json:"state" jsonschema:"starting, idle, running or queued"`
	IdleS          float64  `json:"idle_s" jsonschema:"seconds since its last cell ended (0 while busy)"`
	ReapInS        *float64 `json:"reap_in_s,omitempty" jsonschema:"seconds until it is reaped for being idle, unless used before; absent while busy"`
	ExecutionCount int      `json:"execution_count"`
	NextEvicted    bool     `json:"next_evicted,omitempty" jsonschema:"true when it is the kernel the cap evicts next"`
}

// ParkedSession is one of the caller's sessions whose kernel is parked.
type ParkedSession struct {
	Session string `json:"session"`
	Kernel  string `json:"kernel" jsonschema:"the kernel that was parked"`
	Backend string `json:"backend"`
	Reason  string `json:"reason" jsonschema:"why it was parked: evicted by the cap, reaped after idle, hibernated after idle, or on request"`
	// Hibernated: it sat idle for hibernate_after; its session has not ended.
	Hibernated bool              `json:"hibernated,omitempty" jsonschema:"it was idle, so its process was ended to free memory; the next python_exec wakes it"`
	AgoS       float64           `json:"ago_s" jsonschema:"seconds since it was parked"`
	Bytes      int64             `json:"bytes"`
	Names      []string          `json:"names" jsonschema:"the names the next python_exec restores"`
	NotSaved   map[string]string `json:"not_saved,omitempty" jsonschema:"names that were not saved (open files, threads, what does not pickle), with why"`
}

// ActionOutput is the result of python_interrupt, python_reset and
// python_close.
type ActionOutput struct {
	Session string `json:"session"`
	Kernel  string `json:"kernel,omitempty"`
	Done    bool   `json:"done" jsonschema:"false when there was nothing to do (see message)"`
	Message string `json:"message"`
}

func (s *Server) pythonSessions(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, SessionsOutput, error) {
	owner, err := s.ownerOf(req)
	if err != nil {
		return nil, SessionsOutput{}, err
	}
	max, idle := s.eng.Limits()
	out := SessionsOutput{Owner: owner, Sessions: []SessionInfo{}, IdleExitS: idle.Seconds(), MaxKernels: max}
	for _, k := range s.kernels(ctx) {
		if k.Owner != owner || k.Child != "" || !s.ours(k) || k.State == engine.StateDead {
			continue
		}
		si := SessionInfo{Session: k.Task, Kernel: k.ID, Backend: k.Backend, State: string(k.State),
			ExecutionCount: k.ExecutionCount, NextEvicted: k.NextEvict}
		if !k.State.Busy() && !k.Attached {
			si.IdleS = k.Idle.Seconds()
			left := max0(idle.Seconds() - si.IdleS)
			si.ReapInS = &left
		}
		out.Sessions = append(out.Sessions, si)
	}
	sort.Slice(out.Sessions, func(i, j int) bool { return out.Sessions[i].Session < out.Sessions[j].Session })
	out.Parked = []ParkedSession{}
	for _, p := range s.eng.Parked() {
		if p.Owner != owner || p.Child != "" || (s.opts.Backend != "" && p.Backend != s.opts.Backend) {
			continue
		}
		ps := ParkedSession{Session: p.Task, Kernel: p.Kernel, Backend: p.Backend, Reason: p.Reason, Hibernated: p.Hibernated,
			AgoS: max0(time.Since(p.Parked).Seconds()), Bytes: p.Bytes, Names: p.Names}
		for _, n := range p.NotSaved {
			if ps.NotSaved == nil {
				ps.NotSaved = map[string]string{}
			}
			ps.NotSaved[n.Name] = n.Why
		}
		out.Parked = append(out.Parked, ps)
	}
	var b strings.Builder
	if len(out.Sessions) == 0 && len(out.Parked) == 0 {
		fmt.Fprintf(&b, "%s has no kernels; python_exec starts one.\n", owner)
	}
	for _, si := range out.Sessions {
		fmt.Fprintf(&b, "%s: kernel %s on %s, %s, %d cells run", si.Session, si.Kernel, si.Backend, si.State, si.ExecutionCount)
		if si.ReapInS != nil {
			fmt.Fprintf(&b, ", idle %.0fs, reaped in %.0fs unless used", si.IdleS, *si.ReapInS)
		}
		if si.NextEvicted {
			b.WriteString(", next to be evicted if the cap is reached")
		}
		b.WriteByte('\n')
	}
	for _, ps := range out.Parked {
		state, back := "parked", "restores"
		if ps.Hibernated {
			state, back = "hibernated", "wakes"
		}
		fmt.Fprintf(&b, "%s: %s (%s %.0fs ago), %s saved; the next python_exec %s it", ps.Session, state, ps.Reason, ps.AgoS,
			english.Count(len(ps.Names), "name"), back)
		if len(ps.NotSaved) > 0 {
			b.WriteString("; not saved: " + strings.Join(slices.Sorted(maps.Keys(ps.NotSaved)), ", "))
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "[idle kernels are reaped after %s; at most %d kernels at once]", idle, max)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, out, nil
}

func max0(f float64) float64 {
	if f < 0 {
		return 0
	}
	return f
}

// sessionKernel resolves the caller and its session's kernel.
func (s *Server) sessionKernel(ctx context.Context, req *mcp.CallToolRequest, arg SessionArg) (owner, session string, k engine.KernelInfo, ok bool, err error) {
	if owner, err = s.ownerOf(req); err != nil {
		return
	}
	if session, err = checkSession(arg.Session); err != nil {
		return
	}
	k, ok = s.kernelOf(ctx, owner, session)
	return
}

func actionResult(o ActionOutput) (*mcp.CallToolResult, ActionOutput, error) {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: o.Message}}}, o, nil
}

func (s *Server) pythonInterrupt(ctx context.Context, req *mcp.CallToolRequest, arg SessionArg) (*mcp.CallToolResult, ActionOutput, error) {
	_, session, k, ok, err := s.sessionKernel(ctx, req, arg)
	if err != nil {
		return nil, ActionOutput{}, err
	}
	if !ok || k.State != engine.StateRunning {
		return actionResult(ActionOutput{Session: session, Kernel: k.ID, Message: fmt.Sprintf("session %s runs no cell: nothing to interrupt", session)})
	}
	if err := s.eng.Interrupt(ctx, k.ID); err != nil {
		return nil, ActionOutput{}, fmt.Errorf("interrupt session %s: %w", session, err)
	}
	return actionResult(ActionOutput{Session: session, Kernel: k.ID, Done: true,
		Message: fmt.Sprintf("session %s: its running cell was interrupted (KeyboardInterrupt); the kernel keeps its state", session)})
}

func (s *Server) pythonReset(ctx context.Context, req *mcp.CallToolRequest, arg SessionArg) (*mcp.CallToolResult, ActionOutput, error) {
	owner, session, _, _, err := s.sessionKernel(ctx, req, arg)
	if err != nil {
		return nil, ActionOutput{}, err
	}
	res, err := s.eng.Execute(ctx, engine.Request{Owner: owner, Task: session, Backend: s.opts.Backend, Tools: s.opts.Tools, Code: "pass", Reset: true})
	if err != nil {
		return nil, ActionOutput{}, fmt.Errorf("reset session %s: %w", session, err)
	}
	id := ""
	if res.Kernel != nil {
		id = res.Kernel.ID
	}
	return actionResult(ActionOutput{Session: session, Kernel: id, Done: true,
		Message: fmt.Sprintf("session %s: a fresh kernel %s; earlier state is gone", session, id)})
}

func (s *Server) pythonClose(ctx context.Context, req *mcp.CallToolRequest, arg SessionArg) (*mcp.CallToolResult, ActionOutput, error) {
	owner, session, k, ok, err := s.sessionKernel(ctx, req, arg)
	if err != nil {
		return nil, ActionOutput{}, err
	}
	if !ok {
		// A parked session's state is all there is of it.
		if dropped, err := s.eng.DropParked(owner, s.opts.Backend, session, "", s.opts.Tools); err == nil && dropped {
			return actionResult(ActionOutput{Session: session, Done: true,
				Message: fmt.Sprintf("session %s: its parked state was dropped; a later python_exec starts a new kernel", session)})
		}
		return actionResult(ActionOutput{Session: session, Message: fmt.Sprintf("session %s has no kernel: nothing to close", session)})
	}
	if err := s.eng.Kill(ctx, k.ID); err != nil {
		return nil, ActionOutput{}, fmt.Errorf("close session %s: %w", session, err)
	}
	return actionResult(ActionOutput{Session: session, Kernel: k.ID, Done: true,
		Message: fmt.Sprintf("session %s: kernel %s killed; a later python_exec starts a new one", session, k.ID)})
}

func (s *Server) addTools() {
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	s.addExecTool(&mcp.Tool{Name: "python_exec", Title: "Run Python in a persistent kernel",
		Description: "Run Python code in your persistent kernel for `session` (default \"default\") and return its stdout, stderr and traceback. " +
			"State persists between calls with the same session, like notebook cells. An exception is a normal result with status \"error\" and the traceback. " +
			"Check kernel.state_lost: when true the kernel was replaced (idle reap, eviction, crash) and earlier variables are gone. " +
			"kernel.state_restored: the kernel was evicted or reaped with its state parked and it came back; the note names what did not (open files, threads). " +
			"Long output is clipped; the result names the file with all of it."})
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "python_sessions", Title: "List your Python kernels", Annotations: readOnly,
		Description: "List your kernels: session, state (idle, running, queued), seconds idle, seconds until an idle kernel is reaped, and cells run; and your parked sessions, whose kernel was evicted or reaped with its state saved for the next python_exec."}, s.pythonSessions)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "python_interrupt", Title: "Interrupt a running cell",
		Description: "Interrupt the cell running in `session` with KeyboardInterrupt. The kernel and its variables stay."}, s.pythonInterrupt)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "python_reset", Title: "Restart a session's kernel",
		Description: "Replace the kernel of `session` with a fresh one: every variable and import is dropped."}, s.pythonReset)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "python_close", Title: "Close a session",
		Description: "Kill the kernel of `session` and free its memory (or drop its parked state). A later python_exec with that session starts a new kernel."}, s.pythonClose)
}
