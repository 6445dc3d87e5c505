package hosttools

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func okHandler(context.Context, Call) (Result, error) { return Result{Text: "ok"}, nil }

func TestRegisterRefuses(t *testing.T) {
	good := Tool{Name: "t", Description: "d", Handler: okHandler}
	with := func(edit func(*Tool)) Tool { t := good; edit(&t); return t }
	tests := []struct {
		name string
		tool Tool
		want string
	}{
		{"name with a dash", with(func(t *Tool) { t.Name = "read-file" }), "not a Python identifier"},
		{"name starting with a digit", with(func(t *Tool) { t.Name = "1x" }), "not a Python identifier"},
		{"no handler", with(func(t *Tool) { t.Handler = nil }), "no handler"},
		{"empty description", with(func(t *Tool) { t.Description = " " }), "one non-empty line"},
		{"two-line description", with(func(t *Tool) { t.Description = "a\nb" }), "one non-empty line"},
		{"bad parameter name", with(func(t *Tool) { t.Params = Schema{{Name: "a b", Type: TypeString}} }), `parameter name "a b"`},
		{"duplicate parameter", with(func(t *Tool) { t.Params = Schema{{Name: "a", Type: TypeString}, {Name: "a", Type: TypeInt}} }), "declared twice"},
		{"unknown type", with(func(t *Tool) { t.Params = Schema{{Name: "a", Type: "float"}} }), `unknown type "float"`},
		{"terminal-like tool declaring a dropped name", with(func(t *Tool) {
			t.DropsBackgroundParams = true
			t.Params = Schema{{Name: "notify_on_complete", Type: TypeBool}}
		}), "would be dropped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := NewRegistry().Register(tc.tool)
			if err == nil {
				t.Fatal("Register accepted it")
			}
			mustContain(t, "error", err.Error(), tc.want)
		})
	}
	t.Run("duplicate tool", func(t *testing.T) {
		r := NewRegistry()
		if err := r.Register(good); err != nil {
			t.Fatal(err)
		}
		err := r.Register(good)
		if err == nil {
			t.Fatal("second Register of the same name succeeded")
		}
		mustContain(t, "error", err.Error(), "already registered")
	})
}

func TestNamesAndDescribe(t *testing.T) {
	r := newBuiltins(t, &Builtins{})
	want := []string{"http_get", "list_files", "read_file", "terminal", "write_file"}
	if got := r.Names(); !slices.Equal(got, want) {
		t.Fatalf("Names = %v, want %v", got, want)
	}
	infos := r.Describe()
	if len(infos) != len(want) || infos[2].Name != "read_file" || infos[2].Params[0].Name != "path" || !infos[2].Params[0].Required {
		t.Fatalf("Describe = %+v", infos)
	}
	if _, err := json.Marshal(infos); err != nil {
		t.Fatalf("Describe is not JSON-serializable: %v", err)
	}
	// Editing what Describe or Lookup returned must not edit the registry.
	infos[2].Params[0].Name = "changed"
	tool, _ := r.Lookup("read_file")
	tool.Params[0].Required = false
	if again, _ := r.Lookup("read_file"); again.Params[0].Name != "path" || !again.Params[0].Required {
		t.Fatalf("the registry's schema was edited through a returned copy: %+v", again.Params[0])
	}
}

func TestDispatch(t *testing.T) {
	r := NewRegistry()
	var got Call
	err := r.Register(Tool{Name: "echo", Description: "echo", Params: Schema{{Name: "x", Type: TypeInt, Required: true}},
		Handler: func(_ context.Context, c Call) (Result, error) {
			got = c
			return Result{Value: map[string]int{"x": 1}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(Tool{Name: "fails", Description: "fails", Handler: func(context.Context, Call) (Result, error) {
		return Result{}, errors.New("boom")
	}}); err != nil {
		t.Fatal(err)
	}

	if _, err := dispatch(t, r, "nope", nil); err == nil {
		t.Fatal("an unknown tool was dispatched")
	} else {
		mustContain(t, "error", err.Error(), `unknown tool "nope"`, "echo, fails")
	}

	_, err = dispatch(t, r, "echo", map[string]any{"x": "1"})
	if !errors.Is(err, ErrInvalidArgs) {
		t.Fatalf("bad args: err = %v, want ErrInvalidArgs", err)
	}
	mustContain(t, "error", err.Error(), "echo: invalid arguments", "without quotes")
	if got.Tool != "" {
		t.Fatal("the handler ran on arguments that failed validation")
	}

	if _, err := dispatch(t, r, "echo", map[string]any{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if got.Owner != "alice" || got.KernelID != "k1" || got.Tool != "echo" || string(got.Args["x"]) != "1" {
		t.Fatalf("handler got %+v", got)
	}

	_, err = dispatch(t, r, "fails", nil)
	if err == nil || err.Error() != "fails: boom" {
		t.Fatalf("handler error = %v, want it named after the tool", err)
	}
}

func TestIsBackgroundParam(t *testing.T) {
	tests := map[string]bool{
		"background": true, "Background": true, "background_job": true, "run_in_background": true,
		"in_background": true, "notify": true, "notify_on_complete": true, "heartbeat": true,
		"heartbeat_interval": true, "persist": true, "persist_on_release": true, "PERSISTENT": true,
		"pty": true, "watch_patterns": true, "check_interval": true,
		"command": false, "timeout": false, "cwd": false, "notifications": false, "run": false, "foreground": false,
	}
	for name, want := range tests {
		if got := IsBackgroundParam(name); got != want {
			t.Errorf("IsBackgroundParam(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestDroppedParams(t *testing.T) {
	r := NewRegistry()
	var got Args
	for _, drops := range []bool{true, false} {
		name := map[bool]string{true: "term", false: "plain"}[drops]
		err := r.Register(Tool{Name: name, Description: name, DropsBackgroundParams: drops,
			Params: Schema{{Name: "command", Type: TypeString, Required: true}},
			Handler: func(_ context.Context, c Call) (Result, error) {
				got = c.Args
				return Result{Text: "ran"}, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
	}
	args := map[string]any{"command": "true", "background": true, "run_in_background": true,
		"notify_on_complete": true, "heartbeat": 5, "persist_on_release": true, "Background_Job": "x"}

	res, err := dispatch(t, r, "term", args)
	if err != nil {
		t.Fatalf("dropped parameters caused an error: %v", err)
	}
	wantDropped := []string{"Background_Job", "background", "heartbeat", "notify_on_complete", "persist_on_release", "run_in_background"}
	if !slices.Equal(res.Dropped, wantDropped) {
		t.Errorf("Dropped = %v, want %v", res.Dropped, wantDropped)
	}
	if len(got) != 1 || string(got["command"]) != `"true"` {
		t.Errorf("the handler got %v, want only command", got)
	}
	mustContain(t, "note", res.Note, "dropped parameters Background_Job, background", "outlive the call")

	// Dropping never edits the caller's arguments.
	mine := rawArgs(t, args)
	if _, err := r.Dispatch(context.Background(), Call{Tool: "term", Args: mine}); err != nil || len(mine) != len(args) {
		t.Errorf("Dispatch edited the caller's args: %v (err %v)", mine, err)
	}

	// Only terminal-like tools drop: elsewhere the same names are unknown.
	_, err = dispatch(t, r, "plain", args)
	if !errors.Is(err, ErrInvalidArgs) {
		t.Fatalf("plain tool with background args: err = %v, want ErrInvalidArgs", err)
	}
	mustContain(t, "error", err.Error(), `unknown parameter "background"`)

	// A validation error after a drop still says what was dropped.
	_, err = dispatch(t, r, "term", map[string]any{"background": true})
	mustContain(t, "error", err.Error(), `missing required parameter "command"`, "dropped parameters background")
}
