// Package ui is kerneldeck's dashboard: a Bubble Tea program that shows the
// engine's kernels per owner, runs cells in them, streams their output and
// the engine's events, and answers tool-call approvals.
//
// The engine runs outside the Bubble Tea loop. Its events and the output of
// running cells reach the UI through commands that wait on a channel and are
// re-armed after each message, so Update never blocks.
package ui

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Engine is what the dashboard needs of an engine: the embedded one
// (Embedded), one attached over a socket (client.Client), or a test's fake.
// Kernels, Limits, Backends and SetLimits are called in Update and must
// not block (a remote SetLimits applies in the background and reports a
// failure as an event); the rest run in commands.
type Engine interface {
	Kernels() []engine.KernelInfo
	Limits() (maxKernels int, idleExit time.Duration)
	SetLimits(maxKernels *int, idleExit *time.Duration) error
	Backends() []string
	Execute(ctx context.Context, req engine.Request) (*engine.Result, error)
	Interrupt(ctx context.Context, id string) error
	Kill(ctx context.Context, id string) error
	ShutdownOwner(ctx context.Context, owner string) int
	Approve(id string, d engine.Decision) error
	// Cells is the engine's record of a kernel's recent cells, whoever ran
	// them.
	Cells(ctx context.Context, kernel string) ([]engine.CellRecord, error)
	// Complete is a kernel's completion of code at cursor (characters).
	Complete(ctx context.Context, kernel, code string, cursor int) (engine.Completion, error)
}

// parker is an engine that parks kernels (the embedded one, or one
// attached): Parked lists the parked states without blocking; Park and
// DropParked run in commands.
type parker interface {
	Parked() []engine.ParkedKernel
	Park(ctx context.Context, id string) (engine.ParkedKernel, error)
	DropParked(owner, backend, task, child string, tools []string) (bool, error)
}

// errNoParking: the engine the dashboard shows does not park kernels.
var errNoParking = errors.New("this engine does not park kernels")

// parkAct parks kernel k in the background.
func parkAct(act func(string, func(context.Context, Engine) error) tea.Cmd, k engine.KernelInfo) tea.Cmd {
	id := k.ID
	return act("parked "+kernelName(k), func(c context.Context, eng Engine) error {
		p, ok := eng.(parker)
		if !ok {
			return errNoParking
		}
		_, err := p.Park(c, id)
		return err
	})
}

// dropAct drops parked state p in the background.
func dropAct(act func(string, func(context.Context, Engine) error) tea.Cmd, p engine.ParkedKernel) tea.Cmd {
	return act("dropped the parked state of "+parkedName(p), func(c context.Context, eng Engine) error {
		pe, ok := eng.(parker)
		if !ok {
			return errNoParking
		}
		dropped, err := pe.DropParked(p.Owner, p.Backend, p.Task, p.Child, nil)
		if err == nil && !dropped {
			err = fmt.Errorf("%s has no parked state any more", parkedName(p))
		}
		return err
	})
}

// parkedName names a parked state for people: owner/task[/child].
func parkedName(p engine.ParkedKernel) string {
	n := p.Owner + "/" + p.Task
	if p.Child != "" {
		n += "/" + p.Child
	}
	return plain(n)
}

// Embedded is the in-process engine as the dashboard uses it.
type Embedded struct{ *engine.Engine }

// Cells implements Engine.
func (e Embedded) Cells(_ context.Context, kernel string) ([]engine.CellRecord, error) {
	return e.Engine.Cells(kernel), nil
}

// Target is where the editor's cells run: a kernel key.
type Target struct {
	Owner, Task, Backend, Child string
	Tools                       []string
}

// String renders the target like an engine key: owner/task[/child]@backend[tools].
func (t Target) String() string {
	s := t.Owner + "/" + t.Task
	if t.Child != "" {
		s += "/" + t.Child
	}
	s += "@" + t.Backend
	if len(t.Tools) > 0 {
		s += "[" + strings.Join(t.Tools, ",") + "]"
	}
	return s
}

func (t Target) matches(k engine.KernelInfo) bool {
	return k.Owner == t.Owner && k.Task == t.Task && k.Backend == t.Backend && k.Child == t.Child &&
		slices.Equal(k.Tools, t.Tools)
}

func targetOf(k engine.KernelInfo) Target {
	return Target{Owner: k.Owner, Task: k.Task, Backend: k.Backend, Child: k.Child, Tools: append([]string(nil), k.Tools...)}
}
