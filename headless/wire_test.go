package headless

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/settings"
	"github.com/kerneldeck/kerneldeck/wire"
)

// Every request a client builds from the protocol's types is read by the
// server with every field it set: encode, parse, compare.
func TestEveryRequestReachesTheServer(t *testing.T) {
	n, per, idle := 3, 2, 90.0
	idleD := 90 * time.Second
	req := func(op wire.Op, set func(r wire.Request)) wire.Request {
		r := wire.NewRequest(op)
		r.Stamp("r-" + string(op))
		if set != nil {
			set(r)
		}
		return r
	}
	cases := []struct {
		msg  wire.Request
		want request
	}{
		{req(wire.OpExecute, func(r wire.Request) {
			*r.(*wire.Execute) = wire.Execute{Head: r.(*wire.Execute).Head, Code: "x = 1", Owner: "ann", Task: "etl", Backend: "local",
				Child: "c1", Tools: []string{"read_file"}, Timeout: 2.5, Reset: true, Stream: true, Input: true}
		}), request{exec: engine.Request{Code: "x = 1", Owner: "ann", Task: "etl", Backend: "local", Child: "c1",
			Tools: []string{"read_file"}, Timeout: 2500 * time.Millisecond, Reset: true}, stream: true, input: true}},
		{req(wire.OpInputReply, func(r wire.Request) {
			a := r.(*wire.InputReply)
			a.To, a.Value, a.EOF = "r-execute", "Ada", true
		}), request{to: "r-execute", value: "Ada", eof: true}},
		{req(wire.OpKernels, func(r wire.Request) { r.(*wire.KernelsQuery).UnlessVersion = "v7" }), request{version: "v7"}},
		{req(wire.OpLimits, func(r wire.Request) {
			l := r.(*wire.Limits)
			l.MaxKernels, l.IdleExit, l.MaxKernelsPerOwner = &n, &idle, &per
		}), request{maxKernels: &n, idleExit: &idleD, perOwner: &per}},
		{req(wire.OpInterrupt, func(r wire.Request) { r.(*wire.KernelOp).Kernel = "k1" }), request{kernel: "k1"}},
		{req(wire.OpKill, func(r wire.Request) { r.(*wire.KernelOp).Kernel = "k2" }), request{kernel: "k2"}},
		{req(wire.OpCells, func(r wire.Request) { r.(*wire.KernelOp).Kernel = "k3" }), request{kernel: "k3"}},
		{req(wire.OpComplete, func(r wire.Request) {
			c := r.(*wire.Complete)
			c.Kernel, c.Code, c.Cursor = "k4", "os.pa", 5
		}), request{kernel: "k4", code: "os.pa", cursor: 5}},
		{req(wire.OpPark, func(r wire.Request) { r.(*wire.KernelOp).Kernel = "k5" }), request{kernel: "k5"}},
		{req(wire.OpDropParked, func(r wire.Request) {
			*r.(*wire.DropParked) = wire.DropParked{Head: r.(*wire.DropParked).Head, Owner: "ann", Task: "etl", Backend: "local",
				Child: "c1", Tools: []string{"read_file"}}
		}), request{owner: "ann", exec: engine.Request{Owner: "ann", Task: "etl", Backend: "local", Child: "c1", Tools: []string{"read_file"}}}},
		{req(wire.OpShutdownOwner, func(r wire.Request) { r.(*wire.ShutdownOwner).Owner = "bob" }), request{owner: "bob"}},
		{req(wire.OpShutdownAll, nil), request{}},
		{req(wire.OpHello, nil), request{}},
		{req(wire.OpApprove, func(r wire.Request) {
			a := r.(*wire.Approve)
			a.Request, a.Decision = "a9", string(engine.ApproveAlways)
		}), request{approval: "a9", decision: engine.ApproveAlways}},
		{req(wire.OpSubscribe, func(r wire.Request) {
			s := r.(*wire.Subscribe)
			s.Since, s.Output, s.BatchMS = 60, true, 50
		}), request{since: time.Minute, output: true, batch: 50 * time.Millisecond}},
	}
	seen := map[wire.Op]bool{}
	s := &server{}
	for _, c := range cases {
		line, _ := json.Marshal(c.msg)
		got, _, err := s.parse(line)
		if err != nil {
			t.Errorf("%s: refused: %v", line, err)
			continue
		}
		var head wire.Head
		json.Unmarshal(line, &head)
		c.want.id, c.want.op = head.ID, head.Op
		seen[head.Op] = true
		if !reflect.DeepEqual(*got, c.want) {
			t.Errorf("%s: read as\n %+v\nwant\n %+v", line, *got, c.want)
		}
	}
	for _, op := range wire.Ops() {
		if !seen[op] {
			t.Errorf("no case sends %s", op)
		}
	}
}

// The limits op takes exactly the settings marked live, by their keys.
func TestLimitsTakeTheLiveSettings(t *testing.T) {
	var live []string
	for _, s := range settings.All() {
		if s.Live {
			live = append(live, s.Key)
		}
	}
	fields := wire.Fields(wire.NewRequest(wire.OpLimits))[2:]
	slices.Sort(live)
	slices.Sort(fields)
	if !slices.Equal(live, fields) {
		t.Errorf("the limits op takes %v; the live settings are %v", fields, live)
	}
}

// BenchmarkParseExecute reads a typical execute line.
func BenchmarkParseExecute(b *testing.B) {
	line := []byte(`{"id":"42","op":"execute","owner":"agent-7","task":"etl","code":"df = load()\nprint(len(df))","timeout":30,"tools":["read_file"],"stream":true}`)
	s := &server{}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := s.parse(line); err != nil {
			b.Fatal(err)
		}
	}
}
