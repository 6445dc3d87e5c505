package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var sizeForm = regexp.MustCompile(`^([0-9]+)\s*([KMGT]i?B?|[kmgt]|B)?$`)

// ParseSize reads a size such as "512MiB", "1GiB", "512M" or "1048576"
// (bytes); units are powers of 1024.
func ParseSize(s string) (int64, error) {
	m := sizeForm.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size; write a number with a unit such as \"512MiB\" or \"2GiB\"", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a size greater than zero", s)
	}
	shift := map[byte]uint{'K': 10, 'M': 20, 'G': 30, 'T': 40}
	if u := strings.ToUpper(m[2]); u != "" && u != "B" {
		sh := shift[u[0]]
		if n > (1<<62)>>sh {
			return 0, fmt.Errorf("%q is too large", s)
		}
		n <<= sh
	}
	return n, nil
}
