package enginetest

import (
	"fmt"
	"github.com/kerneldeck/kerneldeck/backends"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// IdleDeaths kills the runner of an idle kernel, rounds times, each at a
// random moment before the next cell is sent (at once, or up to 30 ms
// before): a runner killed before a cell reaches it never ran that cell,
// so every call must succeed, in a fresh kernel with state_lost where the
// runner was gone, and every cell must run exactly once (each appends its
// number to a file on the host, which is read at the end).
func IdleDeaths(t *testing.T, newEnv func(t *testing.T) backends.Env, rounds int) {
	h := New(t, newEnv(t), nil)
	dir := strings.TrimSpace(h.Host(`d=$(mktemp -d) && chmod 700 "$d" && echo "$d"`))
	if dir == "" {
		t.Fatal("no dir for the log of the cells on the host")
	}
	t.Cleanup(func() { h.Host("rm -rf -- '" + dir + "'") })
	log := dir + "/ran"
	cell := func(i int) string { return fmt.Sprintf("with open(%q, 'a') as f: f.write('%d\\n')", log, i) }

	res := h.Run("dying", cell(0), 30*time.Second)
	expectStatus(t, res, "success")
	lost := 0
	for i := 1; i <= rounds; i++ {
		h.Host(fmt.Sprintf("kill -KILL %d", res.Kernel.PID))
		if d := rand.IntN(40); d < 30 {
			time.Sleep(time.Duration(d) * time.Millisecond)
		}
		res = h.Run("dying", cell(i), 30*time.Second)
		if res.Status != "success" {
			t.Fatalf("round %d: the cell after its runner was killed while idle failed: status %s, traceback %q, kernel %+v",
				i, res.Status, res.Traceback, res.Kernel)
		}
		if !res.Kernel.StateLost {
			t.Fatalf("round %d: the cell ran in a kernel whose runner was killed, yet state_lost is false: %+v", i, res.Kernel)
		}
		lost++
	}
	counts := map[int]int{}
	for _, line := range strings.Fields(h.Host("cat -- '" + log + "'")) {
		n, err := strconv.Atoi(line)
		if err != nil {
			t.Fatalf("the cells' log holds %q", line)
		}
		counts[n]++
	}
	for i := 0; i <= rounds; i++ {
		if counts[i] != 1 {
			t.Errorf("cell %d ran %d times, want once", i, counts[i])
		}
	}
	t.Logf("%d idle deaths, each answered by a fresh kernel", lost)
}
