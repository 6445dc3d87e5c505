package english

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0µs"},
		{87 * time.Microsecond, "87µs"},
		{312*time.Millisecond + 900*time.Microsecond, "312ms"},
		{1994 * time.Millisecond, "1.99s"},
		{10002400 * time.Microsecond, "10.00s"},
		{59 * time.Second, "59.00s"},
		{125*time.Second + 700*time.Millisecond, "2m05s"},
		{30 * time.Minute, "30m00s"},
		{62*time.Minute + 59*time.Second, "1h02m"},
		{-1500 * time.Millisecond, "-1.50s"},
	} {
		if got := Duration(tc.d); got != tc.want {
			t.Errorf("Duration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
