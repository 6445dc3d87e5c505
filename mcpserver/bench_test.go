package mcpserver

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kerneldeck/kerneldeck/engine"
)

// instantEngine answers every cell at once, so a benchmark measures the
// MCP layer alone.
type instantEngine struct{}

func (instantEngine) Kernels() []engine.KernelInfo  { return nil }
func (instantEngine) Parked() []engine.ParkedKernel { return nil }
func (instantEngine) DropParked(string, string, string, string, []string) (bool, error) {
	return false, nil
}
func (instantEngine) Limits() (int, time.Duration)            { return 4, time.Hour }
func (instantEngine) Interrupt(context.Context, string) error { return nil }
func (instantEngine) Kill(context.Context, string) error      { return nil }
func (instantEngine) Approve(string, engine.Decision) error   { return nil }
func (instantEngine) Execute(_ context.Context, r engine.Request) (*engine.Result, error) {
	if r.OnStart != nil {
		r.OnStart("c1")
	}
	return &engine.Result{Status: engine.StatusSuccess, Stdout: "1\n", Kernel: &engine.KernelResult{ID: "k1", Backend: "local", Reused: true, ExecutionCount: 2}}, nil
}

// BenchmarkExecOverhead is what the MCP layer (SDK client and server,
// schemas, this package) adds to a cell, in memory.
func BenchmarkExecOverhead(b *testing.B) {
	for _, version := range []string{"2026-07-28", "2025-11-25"} {
		b.Run(version, func(b *testing.B) { benchExec(b, version) })
	}
}

func benchExec(b *testing.B, version string) {
	ctx := context.Background()
	s := New(instantEngine{}, Options{Owner: "o"})
	ct, st := mcp.NewInMemoryTransports()
	if _, err := s.MCP().Connect(ctx, st, nil); err != nil {
		b.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "b"}, nil).Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	args := map[string]any{"code": "1"}
	b.ResetTimer()
	for b.Loop() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "python_exec", Arguments: args})
		if err != nil || res.IsError {
			b.Fatal(err, res)
		}
	}
}
