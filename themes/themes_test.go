package themes

import (
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"

	"github.com/kerneldeck/kerneldeck/engine"
)

// trueColor returns a renderer at the TrueColor profile with a fixed
// background, so tests never query a terminal.
func trueColor(dark bool) *lipgloss.Renderer {
	r := lipgloss.NewRenderer(io.Discard)
	r.SetColorProfile(termenv.TrueColor)
	r.SetHasDarkBackground(dark)
	return r
}

func mustNew(t *testing.T, name string, opts Options) *Theme {
	t.Helper()
	th, err := New(name, opts)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return th
}

var styleType = reflect.TypeOf(lipgloss.Style{})

// allStyles returns every style of a theme by name: the exported Style
// fields, each EventTypes entry and the help styles.
func allStyles(th *Theme) map[string]lipgloss.Style {
	out := map[string]lipgloss.Style{}
	v := reflect.ValueOf(th).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if f.IsExported() && f.Type == styleType {
			out[f.Name] = v.Field(i).Interface().(lipgloss.Style)
		}
	}
	for k, s := range th.EventTypes {
		out["EventTypes["+string(k)+"]"] = s
	}
	hs := th.HelpStyles()
	hv := reflect.ValueOf(hs)
	for i := 0; i < hv.NumField(); i++ {
		out["help."+hv.Type().Field(i).Name] = hv.Field(i).Interface().(lipgloss.Style)
	}
	return out
}

var sgrRE = regexp.MustCompile("\x1b\\[([0-9;]*)m")

// sgrParams returns the SGR parameters used in s, with the arguments of
// extended colours (38;5;n, 38;2;r;g;b and the 48 forms) folded into their
// 38/48 parameter.
func sgrParams(s string) []int {
	var out []int
	for _, m := range sgrRE.FindAllStringSubmatch(s, -1) {
		parts := strings.Split(m[1], ";")
		for i := 0; i < len(parts); i++ {
			n, err := strconv.Atoi(parts[i])
			if err != nil {
				continue
			}
			out = append(out, n)
			if (n == 38 || n == 48 || n == 58) && i+1 < len(parts) {
				switch parts[i+1] {
				case "5":
					i += 2
				case "2":
					i += 4
				}
			}
		}
	}
	return out
}

func isColorParam(n int) bool {
	switch {
	case n >= 30 && n <= 39, n >= 40 && n <= 49, n == 58, n == 59,
		n >= 90 && n <= 97, n >= 100 && n <= 107:
		return true
	}
	return false
}

func hasColor(s string) bool {
	for _, n := range sgrParams(s) {
		if isColorParam(n) {
			return true
		}
	}
	return false
}

func hasParam(s string, want int) bool {
	for _, n := range sgrParams(s) {
		if n == want {
			return true
		}
	}
	return false
}

func TestSGRParams(t *testing.T) {
	got := sgrParams("\x1b[1;38;2;1;2;3;48;5;200;7mx\x1b[0m\x1b[91m")
	want := []int{1, 38, 48, 7, 0, 91}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sgrParams = %v, want %v", got, want)
	}
}

func TestNames(t *testing.T) {
	want := []string{"dark", "light", "high-contrast"}
	if got := Names(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	Names()[0] = "mutated"
	if Names()[0] != "dark" {
		t.Fatal("Names returns shared storage")
	}
}

func TestNewBuildsEveryTheme(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", "dark"},
		{"dark", "dark"},
		{"light", "light"},
		{"high-contrast", "high-contrast"},
		{" Light ", "light"},
		{"HIGH-CONTRAST", "high-contrast"},
	}
	for _, tc := range tests {
		for _, noColor := range []bool{false, true} {
			th := mustNew(t, tc.in, Options{NoColor: noColor, Renderer: trueColor(true)})
			if th.Name != tc.want {
				t.Errorf("New(%q).Name = %q, want %q", tc.in, th.Name, tc.want)
			}
			if th.NoColor != noColor {
				t.Errorf("New(%q).NoColor = %v, want %v", tc.in, th.NoColor, noColor)
			}
			if len(th.EventTypes) == 0 {
				t.Errorf("New(%q): no event styles", tc.in)
			}
			for name, s := range allStyles(th) {
				if got := s.Render("x"); !strings.Contains(got, "x") {
					t.Errorf("%s/%s renders %q", tc.in, name, got)
				}
			}
		}
	}
}

func TestDefaultRenderer(t *testing.T) {
	th := mustNew(t, "", Options{NoColor: true}) // NoColor: no terminal query
	if th.Renderer != lipgloss.DefaultRenderer() {
		t.Fatal("nil Options.Renderer should mean the default renderer")
	}
}

func TestUnknownTheme(t *testing.T) {
	for _, name := range []string{"solarized", "dark2", "-"} {
		th, err := New(name, Options{Renderer: trueColor(true)})
		if err == nil || th != nil {
			t.Fatalf("New(%q) = %v, %v; want an error", name, th, err)
		}
		want := `unknown theme "` + name + `"; choose dark, light or high-contrast`
		if err.Error() != want {
			t.Errorf("New(%q) error = %q, want %q", name, err, want)
		}
	}
}

func TestNoColorHasNoColorCodes(t *testing.T) {
	for _, name := range Names() {
		for _, dark := range []bool{true, false} {
			th := mustNew(t, name, Options{NoColor: true, Renderer: trueColor(dark)})
			for sname, s := range allStyles(th) {
				out := s.Width(12).Render("kernel")
				if hasColor(out) {
					t.Errorf("%s (dark=%v) %s under NoColor renders colour: %q", name, dark, sname, out)
				}
			}
		}
	}
}

func TestColouredThemesUseColour(t *testing.T) {
	// Styles that must be coloured in every coloured theme.
	coloured := []string{"Title", "Header", "CapFull", "CapOver", "PaneBorder",
		"PaneBorderFocused", "StateRunning", "StateDead", "OK", "Warn", "Error",
		"Prompt", "HelpKey", "EventTypes[evicted_cap]"}
	for _, name := range Names() {
		for _, dark := range []bool{true, false} {
			th := mustNew(t, name, Options{Renderer: trueColor(dark)})
			all := allStyles(th)
			for _, sname := range coloured {
				if out := all[sname].Render("kernel"); !hasColor(out) {
					t.Errorf("%s (dark=%v) %s has no colour: %q", name, dark, sname, out)
				}
			}
		}
	}
}

func TestHighContrastUsesBasicColoursOnly(t *testing.T) {
	for _, dark := range []bool{true, false} {
		th := mustNew(t, "high-contrast", Options{Renderer: trueColor(dark)})
		for sname, s := range allStyles(th) {
			out := s.Render("kernel")
			for _, n := range sgrParams(out) {
				if n == 38 || n == 48 || n == 58 {
					t.Errorf("high-contrast (dark=%v) %s uses an extended colour: %q", dark, sname, out)
				}
			}
		}
		if !hasParam(th.Header.Render("h"), 1) {
			t.Errorf("high-contrast header is not bold")
		}
	}
}

func TestHeaderItemsKeepTheBar(t *testing.T) {
	for _, name := range Names() {
		th := mustNew(t, name, Options{Renderer: trueColor(true)})
		for _, item := range []lipgloss.Style{th.HeaderItem, th.CapOK} {
			if item.GetBackground() != th.Header.GetBackground() {
				t.Errorf("%s: header item background %v, want %v", name, item.GetBackground(), th.Header.GetBackground())
			}
		}
		if th.HeaderItem.GetHorizontalPadding() != 0 {
			t.Errorf("%s: HeaderItem has padding", name)
		}
		nc := mustNew(t, name, Options{NoColor: true, Renderer: trueColor(true)})
		if !hasParam(nc.HeaderItem.Render("h"), 7) || !hasParam(nc.Header.Render("h"), 7) {
			t.Errorf("%s: the NoColor header bar is not reversed", name)
		}
	}
}

func TestAdaptsToBackground(t *testing.T) {
	for _, name := range Names() {
		d := mustNew(t, name, Options{Renderer: trueColor(true)})
		l := mustNew(t, name, Options{Renderer: trueColor(false)})
		if d.Editor.Render("x") == l.Editor.Render("x") {
			t.Errorf("%s: editor text does not adapt to the background", name)
		}
	}
}

func TestSelectedVisibleWithoutColour(t *testing.T) {
	for _, name := range Names() {
		th := mustNew(t, name, Options{NoColor: true, Renderer: trueColor(true)})
		sel := th.Selected.Render("row")
		if !hasParam(sel, 7) {
			t.Errorf("%s: Selected under NoColor has no reverse video: %q", name, sel)
		}
		if sel == th.App.Render("row") || sel == th.StateIdle.Render("row") {
			t.Errorf("%s: Selected looks like an unselected row: %q", name, sel)
		}
	}
}

func TestFocusVisibleWithoutColour(t *testing.T) {
	for _, name := range Names() {
		th := mustNew(t, name, Options{NoColor: true, Renderer: trueColor(true)})
		blur := th.PaneBorder.Width(10).Render("pane")
		focus := th.PaneBorderFocused.Width(10).Render("pane")
		if blur == focus {
			t.Errorf("%s: focused and unfocused panes look the same under NoColor:\n%s", name, focus)
		}
		if th.PaneTitle.Render("t") == th.PaneTitleFocused.Render("t") {
			t.Errorf("%s: focused pane title looks the same under NoColor", name)
		}
		if lipgloss.Width(blur) != lipgloss.Width(focus) || lipgloss.Height(blur) != lipgloss.Height(focus) {
			t.Errorf("%s: focus changes the pane size", name)
		}
		if th.PaneBorder.GetHorizontalFrameSize() != th.PaneBorderFocused.GetHorizontalFrameSize() ||
			th.PaneBorder.GetVerticalFrameSize() != th.PaneBorderFocused.GetVerticalFrameSize() {
			t.Errorf("%s: focus changes the frame size", name)
		}
	}
}

// TestDistinctWithoutColour checks that styles the operator must tell apart
// still render differently under NoColor.
func TestDistinctWithoutColour(t *testing.T) {
	groups := map[string][]string{
		"cap":    {"CapOK", "CapFull", "CapOver"},
		"states": {"StateIdle", "StateRunning", "StateQueued", "StateStarting", "StateDead"},
		"evict":  {"StateIdle", "NextEvict"},
		"status": {"OK", "Warn", "Error"},
	}
	for _, name := range Names() {
		th := mustNew(t, name, Options{NoColor: true, Renderer: trueColor(true)})
		all := allStyles(th)
		for g, names := range groups {
			seen := map[string]string{}
			for _, sname := range names {
				out := all[sname].Render("word")
				if prev, dup := seen[out]; dup {
					t.Errorf("%s/%s: %s and %s look the same under NoColor: %q", name, g, prev, sname, out)
				}
				seen[out] = sname
			}
		}
	}
}

func TestEventStyle(t *testing.T) {
	th := mustNew(t, "dark", Options{Renderer: trueColor(true)})
	if got, want := th.EventStyle("no_such_event").Render("e"), th.Muted.Render("e"); got != want {
		t.Errorf("unknown event renders %q, want Muted %q", got, want)
	}
	if th.EventStyle("").Render("e") != th.Muted.Render("e") {
		t.Errorf("empty event type does not fall back to Muted")
	}
	for _, typ := range []engine.EventType{"evicted_cap", "reaped_idle", "state_lost", "rpc_rejected", "approval_request", "spawned", "cell_finished"} {
		s, ok := th.EventTypes[typ]
		if !ok {
			t.Errorf("no style for event %q", typ)
			continue
		}
		if th.EventStyle(typ).Render("e") != s.Render("e") {
			t.Errorf("EventStyle(%q) does not return its EventTypes entry", typ)
		}
	}
	if th.EventStyle("evicted_cap").Render("e") == th.Muted.Render("e") {
		t.Error("evicted_cap should stand out from Muted")
	}
}

func TestHelpStyles(t *testing.T) {
	th := mustNew(t, "light", Options{Renderer: trueColor(false)})
	hs := th.HelpStyles()
	pairs := []struct {
		name      string
		got, want lipgloss.Style
	}{
		{"ShortKey", hs.ShortKey, th.HelpKey},
		{"FullKey", hs.FullKey, th.HelpKey},
		{"ShortDesc", hs.ShortDesc, th.HelpDesc},
		{"FullDesc", hs.FullDesc, th.HelpDesc},
		{"ShortSeparator", hs.ShortSeparator, th.HelpSep},
		{"FullSeparator", hs.FullSeparator, th.HelpSep},
		{"Ellipsis", hs.Ellipsis, th.HelpSep},
	}
	for _, p := range pairs {
		if p.got.Render("k") != p.want.Render("k") {
			t.Errorf("help.%s does not match the theme", p.name)
		}
	}
}

func TestNoColorFromEnv(t *testing.T) {
	tests := []struct {
		val  string
		set  bool
		want bool
	}{
		{"", false, false},
		{"", true, false},
		{"1", true, true},
		{"0", true, true}, // any non-empty value counts
		{"yes", true, true},
	}
	for _, tc := range tests {
		t.Setenv("NO_COLOR", tc.val) // restored when the test ends
		if !tc.set {
			os.Unsetenv("NO_COLOR")
		}
		if got := NoColorFromEnv(); got != tc.want {
			t.Errorf("NO_COLOR=%q: NoColorFromEnv() = %v, want %v", tc.val, got, tc.want)
		}
	}
}

// TestAllEngineEventsStyled guards against a typo in the event table: every
// key is a known engine event type.
func TestAllEngineEventsStyled(t *testing.T) {
	var known []string
	for _, typ := range engine.EventTypes() {
		known = append(known, string(typ))
	}
	th := mustNew(t, "dark", Options{NoColor: true, Renderer: trueColor(true)})
	var keys []string
	for k := range th.EventTypes {
		keys = append(keys, string(k))
	}
	sort.Strings(keys)
	sort.Strings(known)
	if !reflect.DeepEqual(keys, known) {
		t.Errorf("event types = %v, want %v", keys, known)
	}
}

// paletteColours returns every colour of a palette by field name.
func paletteColours(p palette) map[string]lipgloss.TerminalColor {
	return map[string]lipgloss.TerminalColor{
		"text": p.text, "subtle": p.subtle, "faint": p.faint,
		"accent": p.accent, "accent2": p.accent2, "accent3": p.accent3,
		"headerFg": p.headerFg, "headerBg": p.headerBg,
		"ok": p.ok, "warn": p.warn, "err": p.err,
		"border": p.border, "borderFocus": p.borderFocus,
		"capFullFg": p.capFullFg, "capFullBg": p.capFullBg,
		"capOverFg": p.capOverFg, "capOverBg": p.capOverBg,
	}
}

// TestColoursResolvedOnce: a theme's colours are resolved for its renderer
// when it is built (the background's choice, a hex colour's nearest in the
// profile), and each renders exactly as the palette's colour would have.
// Left unresolved, every Render searched the 256-colour table again.
func TestColoursResolvedOnce(t *testing.T) {
	palettes := map[string]palette{Dark: darkPalette(), Light: lightPalette(), HighContrast: highContrastPalette()}
	for _, profile := range []termenv.Profile{termenv.TrueColor, termenv.ANSI256, termenv.ANSI, termenv.Ascii} {
		for _, dark := range []bool{true, false} {
			r := lipgloss.NewRenderer(io.Discard)
			r.SetColorProfile(profile)
			r.SetHasDarkBackground(dark)
			b := builder{r: r, color: true}
			for name, p := range palettes {
				for field, c := range paletteColours(p) {
					n := b.native(c)
					for _, side := range []func(lipgloss.Style, lipgloss.TerminalColor) lipgloss.Style{lipgloss.Style.Foreground, lipgloss.Style.Background} {
						if want, got := side(r.NewStyle(), c).Render("x"), side(r.NewStyle(), n).Render("x"); got != want {
							t.Errorf("profile %v dark %v %s.%s: resolved %#v renders %q, the palette's colour %q", profile, dark, name, field, n, got, want)
						}
					}
				}
				th := build(name, p, b)
				for style, s := range allStyles(th) {
					for _, c := range []lipgloss.TerminalColor{s.GetForeground(), s.GetBackground(), s.GetBorderTopForeground()} {
						if _, adaptive := c.(lipgloss.AdaptiveColor); adaptive {
							t.Errorf("profile %v %s.%s: colour %#v left adaptive", profile, name, style, c)
						}
						if hex, ok := c.(lipgloss.Color); ok && profile != termenv.TrueColor && strings.HasPrefix(string(hex), "#") {
							t.Errorf("profile %v %s.%s: colour %q left for every Render to convert", profile, name, style, hex)
						}
					}
				}
			}
		}
	}
}
