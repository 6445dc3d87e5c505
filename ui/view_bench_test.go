package ui

import (
	"fmt"
	"strings"
	"testing"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/muesli/termenv"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/themes"
)

// benchFixture is the dashboard with n kernels over owners owners and 200
// events at 200x60, the snapshot taken.
func benchFixture(b *testing.B, n, owners int) *fixture {
	return benchFixtureThemed(b, n, owners, nil)
}

// benchFixtureThemed is benchFixture with the dashboard on theme th (nil:
// the ASCII one).
func benchFixtureThemed(b *testing.B, n, owners int, th *themes.Theme) *fixture {
	b.Helper()
	f := newFixture(b, fixtureOpts{kernels: manyKernels(n, owners, false), cap: n, theme: th})
	f.update(eventBatchMsg(manyEvents(200, false)))
	f.update(tea.WindowSizeMsg{Width: 200, Height: 60})
	if len(f.m.kernels.kernels) != n {
		b.Fatalf("snapshot has %d kernels", len(f.m.kernels.kernels))
	}
	return f
}

// BenchmarkView10kKernels: one View() of the dashboard with 10,000 kernels
// over 100 owners and 200 events at 200x60. View formats only the visible
// rows; the budget is 16 ms.
//
//	go test ./ui -run XXX -bench View -benchtime 200x -count 3
func BenchmarkView10kKernels(b *testing.B) {
	f := benchFixture(b, 10000, 100)
	f.keys(keyTab) // kernels focused: the selected-row style is drawn too
	for range 5000 {
		f.keys(runes("j")) // the cursor in the middle of the list
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_ = f.m.View()
	}
}

// BenchmarkViewScaling: View() should not grow with the number of kernels
// beyond the O(n) header count.
func BenchmarkViewScaling(b *testing.B) {
	for _, n := range []int{100, 1000, 10000, 100000} {
		b.Run(fmt.Sprintf("kernels=%d", n), func(b *testing.B) {
			f := benchFixture(b, n, 100)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				_ = f.m.View()
			}
		})
	}
}

// BenchmarkViewColour: one View() of the dashboard the bench's idle row
// measures (1,000 kernels, 160x50) on a terminal with colour: every styled
// segment's colours reach the terminal's profile, which the ASCII fixture
// of the other benchmarks never pays for.
//
//	go test ./ui -run XXX -bench ViewColour -benchtime 2000x
func BenchmarkViewColour(b *testing.B) {
	for _, p := range []struct {
		name    string
		profile termenv.Profile
	}{{"ansi256", termenv.ANSI256}, {"truecolor", termenv.TrueColor}, {"ansi", termenv.ANSI}} {
		b.Run(p.name, func(b *testing.B) {
			th, err := themes.New(themes.Dark, themes.Options{Renderer: renderer(p.profile)})
			if err != nil {
				b.Fatal(err)
			}
			f := benchFixtureThemed(b, 1000, 100, th)
			f.update(tea.WindowSizeMsg{Width: 160, Height: 50})
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				_ = f.m.View()
			}
		})
	}
}

// BenchmarkRefresh10kKernels: the once-a-second snapshot refresh with 10k
// kernels, whole and in its two parts: Kernels() (the fake copies the list
// as the engine does; the real engine also builds it under its lock) and
// the regroup into owner rows (setSnapshot).
func BenchmarkRefresh10kKernels(b *testing.B) {
	f := benchFixture(b, 10000, 100)
	b.Run("refresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			f.m.refresh()
		}
	})
	b.Run("Kernels", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = f.eng.Kernels()
		}
	})
	b.Run("regroup", func(b *testing.B) {
		ks := f.eng.Kernels()
		b.ReportAllocs()
		for b.Loop() {
			f.m.kernels.setSnapshot(ks, f.m.idleExit, f.m.reasons)
		}
	})
}

// BenchmarkTick10kKernels: a whole timer tick as the program runs it: the
// refresh, then the View that follows.
func BenchmarkTick10kKernels(b *testing.B) {
	f := benchFixture(b, 10000, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		f.m.refresh()
		_ = f.m.View()
	}
}

// BenchmarkStreamChunk: one chunk of streamed output arriving for a cell
// that already printed 200 KB, in a target with 20 finished cells: only the
// running cell's tail is wrapped again.
//
//	go test ./ui -run XXX -bench StreamChunk
func BenchmarkStreamChunk(b *testing.B) {
	f := newFixture(b, fixtureOpts{})
	f.update(tea.WindowSizeMsg{Width: 200, Height: 60})
	target := f.m.editor.Target()
	for i := range 20 {
		r := &cellRun{seq: i + 1, target: target, code: "print(1)", res: &engine.Result{Status: engine.StatusSuccess,
			Stdout: strings.Repeat("finished output line\n", 500)}}
		f.m.output.add(r)
	}
	run := &cellRun{seq: 21, target: target, code: "loop()", running: true}
	f.m.output.add(run)
	line := strings.Repeat("x", 99) + "\n"
	for range 2000 {
		f.m.onBackground(cellOutputMsg{run: run, stream: "stdout", text: line})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		f.m.onBackground(cellOutputMsg{run: run, stream: "stdout", text: line})
	}
}
