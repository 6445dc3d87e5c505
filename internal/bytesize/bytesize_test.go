package bytesize

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{"512MiB": 512 << 20, "1GiB": 1 << 30, "2G": 2 << 30, "64m": 64 << 20,
		"1048576": 1 << 20, "3 KiB": 3 << 10, "256mb": 256 << 20, "1g": 1 << 30, "100b": 100} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1MiB", "1.5GiB", "12XB", "99999999999TiB", "lots", "5iB"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) gave no error", bad)
		}
	}
}
