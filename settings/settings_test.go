package settings_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/settings"
)

// Every setting has its own key and flag, an example that is valid written
// either way, and a field of its own that the example sets.
func TestEverySettingIsWhole(t *testing.T) {
	keys, flags := map[string]bool{}, map[string]bool{}
	for _, s := range settings.All() {
		if keys[s.Key] || (s.Flag != "" && flags[s.Flag]) {
			t.Errorf("%s / --%s is defined twice", s.Key, s.Flag)
		}
		keys[s.Key], flags[s.Flag] = true, true
		if s.Flag != "" && (s.Help == "" || (s.Kind != settings.Bool && !strings.Contains(s.Help, "`"))) {
			t.Errorf("--%s has no help, or no `PLACEHOLDER` in it: %q", s.Flag, s.Help)
		}
		example := s.Example
		if s.Kind == settings.Bool {
			example = "true"
		}
		fromFlag, err := s.ParseText(example)
		if err != nil {
			t.Errorf("%s: its example %q is refused: %v", s.Key, example, err)
			continue
		}
		var fileValue any = example
		switch s.Kind {
		case settings.Count, settings.Megabytes:
			fileValue = fromFlag
		case settings.Bool:
			fileValue = true
		}
		fromFile, err := s.ParseFile("test", fileValue)
		if err != nil || !reflect.DeepEqual(fromFile, fromFlag) {
			t.Errorf("%s: the example reads %v from a file (%v), %v from a flag", s.Key, fromFile, err, fromFlag)
		}
		var vals settings.Values
		s.Set(&vals, fromFlag)
		if vals == (settings.Values{}) {
			t.Errorf("%s: setting it to %s changed no value", s.Key, example)
		}
	}
}

// A bad value is said in one wording, the rule and an example, whether it
// came from a flag, the file or the headless limits op.
func TestABadValueIsSaidOneWay(t *testing.T) {
	set, ok := settings.Lookup("max_kernels")
	if !ok {
		t.Fatal("no max_kernels")
	}
	_, flagErr := set.ParseText("0")
	_, fileErr := set.ParseFile("config file x.toml", int64(0))
	_, opErr := set.CheckCount(`"max_kernels":`, 0)
	for want, err := range map[string]error{
		"--max-kernels 0 is invalid: it must be a whole number >= 1, e.g. --max-kernels 4":                     flagErr,
		"config file x.toml: max_kernels = 0 is invalid: it must be a whole number >= 1, e.g. max_kernels = 4": fileErr,
		`"max_kernels": 0 is invalid: it must be a whole number >= 1, e.g. "max_kernels": 4`:                   opErr,
	} {
		if err == nil || err.Error() != want {
			t.Errorf("got %v, want %s", err, want)
		}
	}
	idle, _ := settings.Lookup("idle_exit")
	for _, bad := range []string{"500ms", "0s", "-1m", "soon"} {
		if _, err := idle.ParseText(bad); err == nil || !strings.Contains(err.Error(), "at least 1s, e.g. --idle-exit 30m") {
			t.Errorf("--idle-exit %s: %v", bad, err)
		}
	}
	if _, err := idle.ParseFile("f", int64(30)); err == nil || !strings.Contains(err.Error(), "quoted duration string") {
		t.Errorf("idle_exit = 30: %v", err)
	}
	if _, err := idle.CheckDuration(`"idle_exit":`, time.Second, "1"); err != nil {
		t.Errorf("idle_exit 1s: %v", err)
	}
	// hibernate_after takes 0 for never, and nothing else below its least.
	hib, _ := settings.Lookup("hibernate_after")
	if v, err := hib.ParseText("0"); err != nil || v != time.Duration(0) {
		t.Errorf("--hibernate-after 0: %v %v", v, err)
	}
	for _, bad := range []string{"500ms", "-1m"} {
		if _, err := hib.ParseText(bad); err == nil || !strings.Contains(err.Error(), "at least 1s (0: never), e.g. --hibernate-after 10m") {
			t.Errorf("--hibernate-after %s: %v", bad, err)
		}
	}
}

// --help says each default as it would be written.
func TestDefaultsAreWrittenAsGiven(t *testing.T) {
	for key, want := range map[string]string{"max_kernels": "4", "idle_exit": "30m", "cell_timeout": "5m",
		"approval_timeout": "1m", "max_tool_calls": "50", "max_kernels_per_owner": "0", "hibernate_after": "10m"} {
		s, _ := settings.Lookup(key)
		if got := s.Default(); got != want {
			t.Errorf("%s: default written %q, want %q", key, got, want)
		}
	}
}

// The settings the limits op changes live are bounded where the engine is:
// its least accepted value is the table's Min, and one step below is refused.
func TestLiveBoundsAreTheEngines(t *testing.T) {
	state := t.TempDir()
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(t.TempDir())}, StateDir: state,
		ParkDir: filepath.Join(state, "parked")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background(), false) })
	set := map[string]func(v int64) error{
		"max_kernels":           func(v int64) error { n := int(v); return eng.SetLimits(&n, nil) },
		"idle_exit":             func(v int64) error { d := time.Duration(v); return eng.SetLimits(nil, &d) },
		"max_kernels_per_owner": func(v int64) error { return eng.SetOwnerQuota(int(v)) },
		"hibernate_after":       func(v int64) error { return eng.SetHibernateAfter(time.Duration(v)) },
	}
	for _, s := range settings.All() {
		if !s.Live {
			continue
		}
		f, ok := set[s.Key]
		if !ok {
			t.Errorf("%s is live, but this test cannot set it on the engine", s.Key)
			continue
		}
		if err := f(s.Min); err != nil {
			t.Errorf("%s: the engine refuses the table's least value %d: %v", s.Key, s.Min, err)
		}
		if err := f(s.Min - 1); !errors.Is(err, engine.ErrBadLimit) {
			t.Errorf("%s: the engine takes %d, below the table's least value: %v", s.Key, s.Min-1, err)
		}
	}
}
