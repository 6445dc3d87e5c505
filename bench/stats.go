package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// ms converts a duration to float milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// msAll converts durations to milliseconds.
func msAll(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = ms(d)
	}
	return out
}

// quantile is the nearest-rank q-quantile of xs (q in [0,1]): the smallest
// sample with at least q of the samples at or below it. NaN when empty.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// median is quantile 0.5, except that an even count averages the two
// middle samples (so two rounds give their mean).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// summary is one figure over the rounds: its median, min and max.
type summary struct {
	Med, Min, Max float64
	N             int // rounds
}

func summarize(xs []float64) summary {
	if len(xs) == 0 {
		return summary{Med: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	return summary{Med: median(xs), Min: slices.Min(xs), Max: slices.Max(xs), N: len(xs)}
}

// results collects one value per round for each named figure.
type results struct {
	mu     sync.Mutex
	vals   map[string][]float64
	notes  map[string]string // why a figure is missing (skipped, failed)
	errors []string          // failures that make the run exit non-zero
}

func newResults() *results {
	return &results{vals: map[string][]float64{}, notes: map[string]string{}}
}

// add records one round's value of figure name.
func (r *results) add(name string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.vals[name] = append(r.vals[name], v)
}

// get summarizes figure name; ok is false when it has no value.
func (r *results) get(name string) (summary, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	xs := r.vals[name]
	return summarize(xs), len(xs) > 0
}

// note says why the figures under prefix are missing.
func (r *results) note(prefix, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes[prefix] = why
}

// noteFor returns the note of the longest prefix of name that has one.
func (r *results) noteFor(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	best := ""
	for p := range r.notes {
		if len(p) > len(best) && len(name) >= len(p) && name[:len(p)] == p {
			best = p
		}
	}
	return r.notes[best]
}

func (r *results) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// failedPrefix tells whether a failure of the phase named prefix was
// recorded.
func (r *results) failedPrefix(prefix string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errors {
		if strings.HasPrefix(e, prefix+":") {
			return true
		}
	}
	return false
}

// writeJSON writes every figure's per-round values to path.
func (r *results) writeJSON(path string) error {
	r.mu.Lock()
	b, err := json.MarshalIndent(map[string]any{"values": r.vals, "notes": r.notes, "errors": r.errors}, "", "  ")
	r.mu.Unlock()
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
