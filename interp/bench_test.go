package interp_test

import (
	"testing"

	"github.com/kerneldeck/kerneldeck/interp"
)

// What a spawn on the local backend pays to know its interpreter (a pyenv
// shim asked costs some 60 ms).
func BenchmarkResolveHere(b *testing.B) {
	for b.Loop() {
		if _, err := interp.Resolve("", interp.Here()); err != nil {
			b.Fatal(err)
		}
	}
}
