package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/hosttools"
)

// Policy says what happens when a kernel calls a host tool: it runs, the
// operator is asked first, or it is refused.
type Policy string

// The approval policies.
const (
	PolicyAllow Policy = "allow"
	PolicyAsk   Policy = "ask"
	PolicyDeny  Policy = "deny"
)

// ParsePolicy accepts "allow", "ask" or "deny".
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyAllow, PolicyAsk, PolicyDeny:
		return p, nil
	}
	return "", fmt.Errorf("approval policy %q is invalid: use allow, ask or deny", s)
}

// DefaultApprovalTimeout is how long an "ask" waits for the operator before
// the call is denied.
const DefaultApprovalTimeout = 60 * time.Second

// Approvals decides, per owner and tool, whether a tool call runs. The most
// specific rule wins: Owners[owner][tool], then Owners[owner]["*"], then
// Tools[tool], then Default (which is PolicyAsk when empty: nothing runs on
// the host unseen unless the operator said so).
type Approvals struct {
	Default Policy
	Tools   map[string]Policy
	Owners  map[string]map[string]Policy
}

// DefaultToolPolicies are the built-in tools' policies when the operator sets
// none: reading the workspace and fetching from the allow-list run, writing
// and running commands ask.
func DefaultToolPolicies() map[string]Policy {
	return map[string]Policy{
		"read_file":  PolicyAllow,
		"list_files": PolicyAllow,
		"http_get":   PolicyAllow,
		"write_file": PolicyAsk,
		"terminal":   PolicyAsk,
	}
}

// For returns the policy for owner calling tool.
func (a Approvals) For(owner, tool string) Policy {
	if rules, ok := a.Owners[owner]; ok {
		if p, ok := rules[tool]; ok {
			return p
		}
		if p, ok := rules["*"]; ok {
			return p
		}
	}
	if p, ok := a.Tools[tool]; ok {
		return p
	}
	if a.Default == "" {
		return PolicyAsk
	}
	return a.Default
}

// Validate checks every policy value.
func (a Approvals) Validate() error {
	check := func(where string, p Policy) error {
		if _, err := ParsePolicy(string(p)); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		return nil
	}
	if a.Default != "" {
		if err := check("default approval", a.Default); err != nil {
			return err
		}
	}
	for t, p := range a.Tools {
		if err := check("approval for tool "+t, p); err != nil {
			return err
		}
	}
	for o, rules := range a.Owners {
		for t, p := range rules {
			if err := check(fmt.Sprintf("approval for owner %s, tool %s", o, t), p); err != nil {
				return err
			}
		}
	}
	return nil
}

// Decision is the operator's answer to an approval request.
type Decision string

// The operator's answers.
const (
	ApproveOnce   Decision = "once"
	ApproveAlways Decision = "always" // for this owner and tool, until the engine stops
	ApproveDeny   Decision = "deny"
)

// ApprovalRequest is a tool call waiting for the operator.
type ApprovalRequest struct {
	ID     string          `json:"request"`
	Kernel string          `json:"kernel"`
	Owner  string          `json:"owner"`
	Tool   string          `json:"tool"`
	Args   json.RawMessage `json:"args"`
	Since  time.Time       `json:"since"`
}

type pendingApproval struct {
	req     ApprovalRequest
	decided chan Decision // buffered 1
}

// approvalDesk holds the tool calls waiting for the operator and the
// (owner, tool) pairs approved "always"; its lock is its own, so a call
// waiting for an answer never touches the registry's.
type approvalDesk struct {
	mu      sync.Mutex
	pending map[string]*pendingApproval // by request id
	grants  map[grant]bool
}

// grant is an (owner, tool) pair approved for every call.
type grant struct{ owner, tool string }

func newApprovalDesk() *approvalDesk {
	return &approvalDesk{pending: map[string]*pendingApproval{}, grants: map[grant]bool{}}
}

func (d *approvalDesk) granted(owner, tool string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.grants[grant{owner, tool}]
}

func (d *approvalDesk) allow(owner, tool string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.grants[grant{owner, tool}] = true
}

// open files p until the returned close is called.
func (d *approvalDesk) open(p *pendingApproval) (close func()) {
	d.mu.Lock()
	d.pending[p.req.ID] = p
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		delete(d.pending, p.req.ID)
		d.mu.Unlock()
	}
}

func (d *approvalDesk) find(id string) (*pendingApproval, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.pending[id]
	return p, ok
}

// list returns the waiting requests, oldest first.
func (d *approvalDesk) list() []ApprovalRequest {
	d.mu.Lock()
	out := make([]ApprovalRequest, 0, len(d.pending))
	for _, p := range d.pending {
		out = append(out, p.req)
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Since.Equal(out[j].Since) {
			return out[i].Since.Before(out[j].Since)
		}
		return strings.Compare(out[i].ID, out[j].ID) < 0
	})
	return out
}

// maxEventArgs bounds the arguments shown in an approval request.
const maxEventArgs = 4096

// clipArgs shortens encoded arguments over maxEventArgs to a JSON string
// that keeps their head and their tail: a harmless start padded out to hide
// what follows would otherwise be all the operator sees.
func clipArgs(args []byte) json.RawMessage {
	if len(args) <= maxEventArgs {
		return args
	}
	head, tail := args[:maxEventArgs*3/4], args[len(args)-maxEventArgs/4:]
	clipped, _ := json.Marshal(fmt.Sprintf("%s ... [clipped: %d of %d bytes not shown] ... %s",
		head, len(args)-len(head)-len(tail), len(args), tail))
	return clipped
}

// errDenied marks a call refused by policy or by the operator.
var errDenied = errors.New("denied")

// authorize applies the owner's policy to a tool call. It returns nil when
// the call may run and an error saying why not otherwise; an "ask" waits for
// Approve, the approval timeout or ctx.
func (e *Engine) authorize(ctx context.Context, k *Kernel, tool string, args hosttools.Args) error {
	owner := k.key.Owner
	e.mu.Lock()
	kernelID, cell := k.id, k.runningCell
	e.mu.Unlock()
	if e.approvals.granted(owner, tool) {
		return nil
	}
	switch e.cfg.Approvals.For(owner, tool) {
	case PolicyAllow:
		return nil
	case PolicyDeny:
		return fmt.Errorf("%w: the approval policy denies %s for owner %s", errDenied, tool, owner)
	}
	// The operator sees the arguments the tool will get, re-encoded from
	// what was decoded (keys sorted), not the bytes the kernel sent.
	shown, err := json.Marshal(args)
	if err != nil {
		return fmt.Errorf("%w: arguments cannot be shown for approval: %v", errDenied, err)
	}
	shown = clipArgs(shown)
	p := &pendingApproval{
		req:     ApprovalRequest{ID: "a" + randomHex(6), Kernel: kernelID, Owner: owner, Tool: tool, Args: shown, Since: e.cfg.Now()},
		decided: make(chan Decision, 1),
	}
	defer e.approvals.open(p)()
	e.emit(Event{Type: EventApprovalRequest, Kernel: kernelID, Owner: owner, Key: k.key.String(), Cell: cell,
		Request: p.req.ID, Tool: tool, Args: shown, Until: p.req.Since.Add(e.cfg.ApprovalTimeout),
		Detail: fmt.Sprintf("%s wants to call %s", owner, tool)})
	timer := time.NewTimer(e.cfg.ApprovalTimeout)
	defer timer.Stop()
	decided := func(d Decision, detail string) {
		e.emit(Event{Type: EventApprovalDecided, Kernel: kernelID, Owner: owner, Key: k.key.String(), Cell: cell,
			Request: p.req.ID, Tool: tool, Detail: string(d) + ": " + detail})
	}
	select {
	case d := <-p.decided:
		switch d {
		case ApproveOnce:
			decided(d, "approved once by the operator")
			return nil
		case ApproveAlways:
			e.approvals.allow(owner, tool)
			decided(d, fmt.Sprintf("approved by the operator for every %s call of owner %s", tool, owner))
			return nil
		default:
			decided(ApproveDeny, "denied by the operator")
			return fmt.Errorf("%w: the operator denied this %s call", errDenied, tool)
		}
	case <-timer.C:
		decided(ApproveDeny, fmt.Sprintf("no answer within %v", e.cfg.ApprovalTimeout))
		return fmt.Errorf("%w: the operator did not answer within %v, so this %s call was denied", errDenied, e.cfg.ApprovalTimeout, tool)
	case <-ctx.Done():
		decided(ApproveDeny, "the cell ended before an answer")
		return fmt.Errorf("%w: the cell ended before the operator answered: %w", errDenied, ctx.Err())
	}
}

// Approve answers a pending approval request with once, always or deny.
func (e *Engine) Approve(requestID string, d Decision) error {
	switch d {
	case ApproveOnce, ApproveAlways, ApproveDeny:
	default:
		return fmt.Errorf("decision %q is invalid: use once, always or deny", d)
	}
	p, ok := e.approvals.find(requestID)
	if !ok {
		return fmt.Errorf("%w %q (it may have been answered or timed out)", ErrUnknownApproval, requestID)
	}
	select {
	case p.decided <- d:
		return nil
	default:
		return fmt.Errorf("approval request %q was already answered", requestID)
	}
}

// PendingApprovals lists the tool calls waiting for the operator, oldest first.
func (e *Engine) PendingApprovals() []ApprovalRequest { return e.approvals.list() }
