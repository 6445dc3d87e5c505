package engine

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The host scripts and the runner's loader print only the engine's
// markers, and every marker is printed by one of them: a marker renamed on
// one side fails here, not on a host.
func TestScriptsSpeakTheEnginesMarkers(t *testing.T) {
	var src strings.Builder
	for _, f := range []string{"scripts.go", "runner/runner.go", "../internal/fakeenv/host.go", "../internal/fakeenv/fakeenv.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	token := regexp.MustCompile(`KD:[A-Z]*`)
	printed := map[marker]bool{}
	for _, m := range token.FindAllString(src.String(), -1) {
		if m == markerPrefix {
			continue // the prefix alone, as in "lines the engine reads start with KD:"
		}
		if !slices.Contains(markers, marker(m)) {
			t.Errorf("%s is printed by a script but is no marker of the engine's", m)
		}
		printed[marker(m)] = true
	}
	for _, m := range markers {
		if !printed[m] {
			t.Errorf("marker %s is printed by no script", m)
		}
	}
}

// The engine's Go code names markers only by their constants.
func TestMarkersAreNamedOnce(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	literal := regexp.MustCompile(`"KD:[A-Z]`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "markers.go" || f == "scripts.go" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if literal.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "//") {
				t.Errorf("%s:%d names a marker by its text: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}
