package wire_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/wire"
)

// fill sets every exported field of v, recursively, to a value of its own
// that is not zero, so a field a conversion drops shows as a difference.
func fill(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch {
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2030, 1, 2, 3, 4, *n, 0, time.UTC)))
		return
	case v.Type() == reflect.TypeFor[time.Duration]():
		v.SetInt(int64(*n) * int64(time.Millisecond))
		return
	case v.Type() == reflect.TypeFor[json.RawMessage]():
		v.SetBytes([]byte(`{"n":` + strconv.Itoa(*n) + `}`))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + strconv.Itoa(*n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(t, v.Index(0), n)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, n)
		fill(t, e, n)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), n)
			}
		}
	default:
		t.Fatalf("fill: a %s field; teach fill its kind", v.Type())
	}
}

func filled[T any](t *testing.T) T {
	var v T
	n := 0
	fill(t, reflect.ValueOf(&v).Elem(), &n)
	return v
}

// through encodes v as a line and decodes the line into a new T, as the
// other end reads it.
func through[T any](t *testing.T, v any) T {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s does not decode: %v", b, err)
	}
	return out
}

func same(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s changed on the wire:\n got %+v\nwant %+v", what, got, want)
	}
}

// Every field of a cell's result reaches the client as the engine gave it.
func TestResultRoundTrip(t *testing.T) {
	r := filled[engine.Result](t)
	line := through[wire.Result](t, wire.ResultOf("x1", &r))
	if line.ID != "x1" || line.Op != wire.OpResult {
		t.Errorf("head %+v, want id x1 and op result", line.Head)
	}
	same(t, "a result", *line.Engine(), r)
	r.Kernel = nil // a per-call fallback
	same(t, "a result without a kernel", *through[wire.Result](t, wire.ResultOf("x1", &r)).Engine(), r)
}

// Every field of a listed kernel reaches the client, its times moved by
// the skew between the clocks.
func TestKernelRoundTrip(t *testing.T) {
	k := filled[engine.KernelInfo](t)
	same(t, "a kernel", through[wire.Kernel](t, wire.KernelOf(k)).Info(0), k)
	skew := 3 * time.Second
	moved := k
	moved.LastUsed, moved.RunningSince = k.LastUsed.Add(skew), k.RunningSince.Add(skew)
	same(t, "a kernel on another clock", through[wire.Kernel](t, wire.KernelOf(k)).Info(skew), moved)
	idle := k
	idle.RunningCell, idle.RunningSince, idle.Tools = "", time.Time{}, nil
	got := through[wire.Kernel](t, wire.KernelOf(idle))
	if got.RunningSince != nil || got.Tools == nil {
		t.Errorf("an idle kernel without tools: running_since %v (want null), tools %v (want [])", got.RunningSince, got.Tools)
	}
}

// Every field of a cell record reaches the client.
func TestCellRoundTrip(t *testing.T) {
	rec := filled[engine.CellRecord](t)
	same(t, "a cell record", through[wire.Cell](t, wire.CellOf(rec)).Record(), rec)
}

// Every field of an event reaches the client but the kernel's key, which
// stays on the engine; a missed event carries its count.
func TestEventRoundTrip(t *testing.T) {
	ev := filled[engine.Event](t)
	ev.Type, ev.Missed = engine.EventSpawned, 0
	want := ev
	want.Key = ""
	same(t, "an event", through[wire.Event](t, wire.EventOf(ev)).Engine(), want)
	missed := engine.Event{Type: engine.EventMissed, Time: ev.Time, Missed: 7}
	got := through[wire.Event](t, wire.EventOf(missed)).Engine()
	if got.Missed != 7 || got.Detail == "" {
		t.Errorf("a missed event came back as %+v, want 7 missed and a detail", got)
	}
}

// Every field of hello and of the lines of a streamed cell survives.
func TestAnswersRoundTrip(t *testing.T) {
	for _, v := range []any{filled[wire.Hello](t), filled[wire.Started](t), filled[wire.DisplayOutput](t), filled[wire.InputRequest](t),
		filled[wire.Killed](t), filled[wire.Subscribed](t), filled[wire.Goodbye](t), filled[wire.Error](t)} {
		back := reflect.New(reflect.TypeOf(v))
		b, _ := json.Marshal(v)
		if err := json.Unmarshal(b, back.Interface()); err != nil {
			t.Fatalf("%s does not decode: %v", b, err)
		}
		same(t, reflect.TypeOf(v).Name(), back.Elem().Interface(), v)
	}
}

// Every op has a request type whose head names it, and every field of it
// survives the line.
func TestRequestsRoundTrip(t *testing.T) {
	for _, op := range wire.Ops() {
		req := wire.NewRequest(op)
		if req == nil {
			t.Fatalf("op %s has no request type", op)
		}
		n := 0
		fill(t, reflect.ValueOf(req).Elem(), &n)
		reflect.ValueOf(req).Elem().FieldByName("Op").SetString(string(op))
		back := wire.NewRequest(op)
		b, _ := json.Marshal(req)
		if err := json.Unmarshal(b, back); err != nil {
			t.Fatalf("%s does not decode: %v", b, err)
		}
		same(t, string(op), back, req)
		if f := wire.Fields(req); !slices.Equal(f[:2], []string{"id", "op"}) {
			t.Errorf("%s's fields begin %v, want id and op", op, f)
		}
	}
	if wire.NewRequest(wire.OpResult) != nil {
		t.Error("result is taken as a request")
	}
}
