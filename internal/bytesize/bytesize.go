// Package bytesize reads sizes as operators write them, in the config
// file, flags and backend URIs: 512MiB, 1GiB, 512m (docker's way), 65536.
package bytesize

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var form = regexp.MustCompile(`^([0-9]+)\s*([kmgt])?(i?b)?$`)

// Parse reads a size; units are powers of 1024, in either case, with or
// without "B" or "iB".
func Parse(s string) (int64, error) {
	m := form.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil || (m[3] == "ib" && m[2] == "") {
		return 0, fmt.Errorf("%q is not a size; write a number with a unit such as \"512MiB\" or \"2GiB\"", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a size greater than zero", s)
	}
	shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m[2]]
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n << shift, nil
}
