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

// Bytes is a size for people: "17 bytes", "4 KB", "12.3 MB", "1.5 GB"
// (units of 1024).
func Bytes(n int64) string {
	switch {
	case n >= 1<<30:
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + " GB"
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MB"
	case n >= 1<<10:
		return strconv.FormatInt(n>>10, 10) + " KB"
	}
	return Count(int(n), "byte")
}
