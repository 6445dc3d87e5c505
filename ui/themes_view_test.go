package ui

import (
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"
	"github.com/muesli/termenv"

	"github.com/kerneldeck/kerneldeck/themes"
)

// themedView renders the cap-full dashboard after an eviction, kernels
// focused, with th.
func themedView(t *testing.T, th *themes.Theme) string {
	t.Helper()
	f := newFixture(t, fixtureOpts{kernels: fullCapKernels(), cap: 4, theme: th})
	f.update(tea.WindowSizeMsg{Width: 100, Height: 30})
	f.eng.SetKernels(afterEviction())
	f.update(eventBatchMsg(evictionEvents())) // the re-armed waiter is not run
	f.update(keyTab)
	return f.m.View()
}

func renderer(p termenv.Profile) *lipgloss.Renderer {
	r := lipgloss.NewRenderer(io.Discard)
	r.SetColorProfile(p)
	r.SetHasDarkBackground(true)
	return r
}

var sgr = regexp.MustCompile(`\x1b\[([0-9;]*)m`)

// colourParams returns the SGR parameters of view that set a colour.
func colourParams(view string) []string {
	var out []string
	for _, m := range sgr.FindAllStringSubmatch(view, -1) {
		for p := range strings.SplitSeq(m[1], ";") {
			n, err := strconv.Atoi(p)
			if err != nil {
				continue
			}
			if n == 38 || n == 48 || (n >= 30 && n <= 37) || (n >= 40 && n <= 47) || (n >= 90 && n <= 97) || (n >= 100 && n <= 107) {
				out = append(out, m[1])
				break
			}
		}
	}
	return out
}

// TestThemesDifferInColour: on a TrueColor renderer every theme colours
// the dashboard, and differently from the others, while the text and the
// layout stay those of the ASCII rendering (high-contrast aside, whose
// borders differ).
func TestThemesDifferInColour(t *testing.T) {
	tc := renderer(termenv.TrueColor)
	views := map[string]string{}
	for _, name := range themes.Names() {
		th, err := themes.New(name, themes.Options{Renderer: tc})
		if err != nil {
			t.Fatal(err)
		}
		v := themedView(t, th)
		if len(colourParams(v)) == 0 {
			t.Errorf("%s: no colour in the TrueColor view", name)
		}
		plain := themedView(t, mustTheme(t, name))
		if strings.Contains(plain, "\x1b") {
			t.Errorf("%s: escape sequences in the ASCII view", name)
		}
		if got := ansi.Strip(v); got != plain {
			t.Errorf("%s: the TrueColor view's text differs from the ASCII view:\n%s\n---\n%s", name, got, plain)
		}
		checkFits(t, v, 100, 30)
		views[name] = v
	}
	names := themes.Names()
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			if views[names[i]] == views[names[j]] {
				t.Errorf("themes %s and %s render the same TrueColor output", names[i], names[j])
			}
		}
	}
}

// TestThemesNoColor: with NO_COLOR no theme emits a colour, even on a
// TrueColor terminal, and the text is unchanged.
func TestThemesNoColor(t *testing.T) {
	tc := renderer(termenv.TrueColor)
	for _, name := range themes.Names() {
		th, err := themes.New(name, themes.Options{NoColor: true, Renderer: tc})
		if err != nil {
			t.Fatal(err)
		}
		v := themedView(t, th)
		if c := colourParams(v); len(c) > 0 {
			t.Errorf("%s: NO_COLOR view sets colours: %q", name, c)
		}
		if !strings.Contains(v, "\x1b[") {
			t.Errorf("%s: NO_COLOR view has no attributes at all (bold, reverse...)", name)
		}
		if got, plain := ansi.Strip(v), themedView(t, mustTheme(t, name)); got != plain {
			t.Errorf("%s: NO_COLOR text differs from the ASCII view", name)
		}
	}
}
