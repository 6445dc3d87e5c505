package backends

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

const (
	// maxKnownHostsFile bounds the size of a known_hosts file.
	maxKnownHostsFile = 64 << 20
	// maxPatternStars bounds the '*' wildcards in one known_hosts host
	// pattern: x/crypto's matcher backtracks, so its time grows
	// exponentially with them (8 take over a minute against a 70-character
	// host name, 3 take microseconds).
	maxPatternStars = 3
)

// checkKnownHostsFile refuses a known_hosts file that would hang the host
// key check: one that is not a regular file (opening a FIFO blocks), is
// huge, or has a host pattern with too many wildcards. It fails closed
// rather than skip a line, since a skipped @revoked line would weaken the
// check.
func checkKnownHostsFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("read known_hosts %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("known_hosts %s is %s, not a regular file; point --known-hosts at a file", path, fileKind(st.Mode()))
	}
	if st.Size() > maxKnownHostsFile {
		return fmt.Errorf("known_hosts %s is %d bytes, over the %d-byte limit", path, st.Size(), maxKnownHostsFile)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read known_hosts %s: %w", path, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, maxKnownHostsFile)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		patterns := fields[0]
		if strings.HasPrefix(patterns, "@") && len(fields) > 1 {
			patterns = fields[1] // after a marker (@revoked, @cert-authority)
		}
		for p := range strings.SplitSeq(patterns, ",") {
			if c := strings.Count(p, "*"); c > maxPatternStars {
				return fmt.Errorf("known_hosts %s line %d: host pattern %.80q has %d '*' wildcards; matching takes time exponential in their number, so at most %d are accepted: simplify the pattern",
					path, n, p, c, maxPatternStars)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read known_hosts %s: %w", path, err)
	}
	return nil
}
