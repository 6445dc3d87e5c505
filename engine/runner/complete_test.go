package runner

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// Without jedi, the runner completes names, attributes, dict keys and
// paths itself (rlcompleter and glob), and an empty word not at all.
func TestCompleteWithoutJedi(t *testing.T) {
	src := string(Source)
	from, to := strings.Index(src, "COMPLETE_MAX = "), strings.Index(src, "\ndef tail_text(")
	if from < 0 || to < from {
		t.Fatal("runner.py has no complete function where this test looks")
	}
	script := "import os, sys, json, _thread\nsys.modules['jedi'] = None  # import jedi fails\n" + src[from:to] + `
ns = {'__builtins__': __builtins__, 'os': os, 'measurements': {'alpha': 1, 'beta': 2}}
out = {}
for code in ['measu', 'os.pa', "measurements['al", "open('/us", 'x = ', 'pri']:
    out[code] = complete(ns, code, len(code))
print(json.dumps(out))
`
	b, err := exec.Command("python3", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	var got map[string][2]json.RawMessage
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	for code, want := range map[string]string{
		"measu":            `[0,["measurements"]]`,
		"os.pa":            `[0,["os.pardir","os.path","os.pathconf(","os.pathconf_names","os.pathsep"]]`,
		"measurements['al": `[13,["'alpha'"]]`,
		"open('/us":        `[6,["/usr/"]]`,
		"x = ":             `[4,[]]`,
		"pri":              `[0,["print("]]`,
	} {
		if g := "[" + string(got[code][0]) + "," + string(got[code][1]) + "]"; strings.ReplaceAll(g, " ", "") != want {
			t.Errorf("complete %q = %s, want %s", code, g, want)
		}
	}
}
