package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/kerneldeck/kerneldeck/engine"
)

// keptFile is where the kernels left running by --keep-kernels are
// recorded (0600 under the 0700 state dir: the records hold RPC tokens).
func keptFile(stateDir string) string { return filepath.Join(stateDir, "kept-kernels.json") }

// adoptKept takes over the kernels an earlier kerneldeck left running, so a
// restart finds them with their state instead of leaking or duplicating
// them. Records for backends this run does not have stay in the file.
func adoptKept(ctx context.Context, eng *engine.Engine, stateDir string, stderr io.Writer, prog string) {
	kept, err := engine.LoadKept(keptFile(stateDir))
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return
	}
	if len(kept) == 0 {
		return
	}
	var here, elsewhere []engine.KeptKernel
	for _, k := range kept {
		if slices.Contains(eng.Backends(), k.Backend) {
			here = append(here, k)
		} else {
			elsewhere = append(elsewhere, k)
		}
	}
	if err := engine.SaveKept(keptFile(stateDir), elsewhere); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	}
	n, skipped := eng.Adopt(ctx, here)
	if n > 0 {
		fmt.Fprintf(stderr, "%s: adopted %d kernel%s left running by an earlier kerneldeck\n", prog, n, plural(n))
	}
	for _, s := range skipped {
		fmt.Fprintf(stderr, "%s: not adopted: %s\n", prog, s)
	}
}

// saveKept records the engine's kernels for the next start, beside any
// records of other backends already in the file. Call it before closing the
// engine with keep.
func saveKept(eng *engine.Engine, stateDir string) error {
	old, err := engine.LoadKept(keptFile(stateDir))
	if err != nil {
		return err
	}
	return engine.SaveKept(keptFile(stateDir), append(old, eng.Kept()...))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
