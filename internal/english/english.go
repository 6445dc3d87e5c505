// Package english renders counts and durations in messages: "1 kernel",
// "3 kernels", "1.99s".
package english

import "strconv"

// Count is n followed by noun, plural unless n is 1 ("1 kernel", "0 kernels").
func Count(n int, noun string) string {
	return strconv.Itoa(n) + " " + Plural(n, noun)
}

// Plural is noun, with an s unless n is 1.
func Plural(n int, noun string) string {
	if n == 1 {
		return noun
	}
	return noun + "s"
}
