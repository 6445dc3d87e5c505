package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// restartPhase: `kerneldeck serve` holding kernels on the local backend is
// killed with SIGKILL and started again on the same state dir, while an
// agent (`headless --connect`) runs cells in a loop. Per round: the time
// from the new serve's start until it serves, and until every kernel has
// answered a cell with its state; and the agent's call latency across the
// restart (p50, p99, most).
func restartPhase(ctx context.Context, cfg config, _ *setupEnv, res *results, log io.Writer) {
	t := newTB("restart", log)
	defer t.close()
	bin, err := buildKerneldeck(t)
	if err != nil {
		res.fail("restart: %v", err)
		return
	}
	n := cfg.RestartKernels
	for r := range min(cfg.Rounds, 3) {
		if ctx.Err() != nil {
			return
		}
		if err := restartRound(ctx, t, bin, n, r, res, log); err != nil {
			res.fail("restart: round %d: %v", r+1, err)
			return
		}
	}
}

// servedBin is one `kerneldeck serve` process.
type servedBin struct {
	cmd   *exec.Cmd
	ready chan struct{}
}

func startServedBin(env []string, bin, state, sock string, n int, log io.Writer) (*servedBin, error) {
	cmd := exec.Command(bin, "serve", "--listen", sock, "--state-dir", state, "--max-kernels", fmt.Sprint(n+4), "--idle-exit", "1h")
	cmd.Env = env
	errPipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &servedBin{cmd: cmd, ready: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(errPipe)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "serving the engine at") {
				once.Do(func() { close(s.ready) })
			}
			if strings.Contains(sc.Text(), "taken back") || strings.Contains(sc.Text(), "took back") {
				fmt.Fprintf(log, "bench: restart: %s\n", sc.Text())
			}
		}
	}()
	select {
	case <-s.ready:
		return s, nil
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("serve did not serve within 2 minutes")
	}
}

func restartRound(ctx context.Context, t *tb, bin string, n, round int, res *results, log io.Writer) error {
	dir := shortTempDir(t)
	env := append(os.Environ(), "TMPDIR="+dir, "XDG_RUNTIME_DIR=")
	state, sock := filepath.Join(dir, "state"), filepath.Join(dir, "run", "engine.sock")
	srv, err := startServedBin(env, bin, state, sock, n, log)
	if err != nil {
		return err
	}
	defer func() {
		srv.cmd.Process.Signal(syscall.SIGTERM)
		srv.cmd.Wait()
	}()
	fill, err := startLineProc(t, env, bin, "headless", "--connect", sock)
	if err != nil {
		return err
	}
	// A spawn that fails (rarely, with a hundred at once) runs the cell
	// once without a kernel: that kernel is asked for again.
	todo := make([]int, n)
	for i := range todo {
		todo[i] = i
	}
	for try := 0; len(todo) > 0; try++ {
		if try == 3 {
			return fmt.Errorf("spawn %d kernels: %d without a kernel after 3 tries", n, len(todo))
		}
		if try > 0 {
			fmt.Fprintf(log, "bench: restart: %d of %d spawns fell back to a per-call run; asking again\n", len(todo), n)
		}
		if todo, err = everyKernel(fill, todo, func(i int) string { return fmt.Sprintf("x = %d", i) }, nil); err != nil {
			return fmt.Errorf("spawn %d kernels: %w", n, err)
		}
	}
	loop, err := startLineProc(t, env, bin, "headless", "--connect", sock)
	if err != nil {
		return err
	}
	var lat []float64
	stop := make(chan struct{})
	looped := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				looped <- nil
				return
			default:
			}
			d, err := loop.cell()
			if err != nil {
				looped <- err
				return
			}
			lat = append(lat, ms(d))
		}
	}()
	time.Sleep(time.Second)
	srv.cmd.Process.Kill()
	srv.cmd.Wait()
	start := time.Now()
	srv, err = startServedBin(env, bin, state, sock, n, log)
	if err != nil {
		close(stop)
		<-looped
		return err
	}
	serving := time.Since(start)
	check, err := startLineProc(t, env, bin, "headless", "--connect", sock)
	if err != nil {
		return err
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	fellBack, err := everyKernel(check, all, func(int) string { return "print(x)" }, func(i int, stdout string) error {
		if stdout != fmt.Sprintf("%d\n", i) {
			return fmt.Errorf("kernel %d answered %q after the restart, not its x", i, stdout)
		}
		return nil
	})
	if err == nil && len(fellBack) > 0 {
		err = fmt.Errorf("kernels %v ran their cell with no kernel after the restart", fellBack)
	}
	usable := time.Since(start)
	time.Sleep(time.Second)
	close(stop)
	if lerr := <-looped; lerr != nil {
		return fmt.Errorf("the agent's loop: %w", lerr)
	}
	// Their input ends before the engine stops: they end, not redial.
	for _, p := range []*lineProc{fill, loop, check} {
		p.in.Close()
		p.cmd.Wait()
	}
	if err != nil {
		return err
	}
	res.add("restart.serving_ms", ms(serving))
	res.add("restart.usable_ms", ms(usable))
	p50, p99, most := quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 1)
	res.add("restart.agent.p50", p50)
	res.add("restart.agent.p99", p99)
	res.add("restart.agent.max", most)
	fmt.Fprintf(log, "bench: restart round %d: %d kernels, serving after %.0fms, all usable after %.0fms; agent %d calls, p50 %.3fms p99 %.1fms max %.0fms\n",
		round+1, n, ms(serving), ms(usable), len(lat), p50, p99, most)
	return nil
}

// everyKernel sends one cell to each kernel of which (owner o<i>) at once
// and waits for every answer, checked by check when given. It returns the
// ones that ran in no kernel (a per-call fallback).
func everyKernel(p *lineProc, which []int, code func(i int) string, check func(i int, stdout string) error) (fellBack []int, err error) {
	for _, i := range which {
		line, _ := json.Marshal(map[string]any{"id": fmt.Sprint(i), "op": "execute", "owner": fmt.Sprintf("o%d", i), "code": code(i)})
		if _, err := p.in.Write(append(line, '\n')); err != nil {
			return nil, err
		}
	}
	for range which {
		line, err := p.out.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var ans struct{ ID, Op, Status, Stdout, Fallback string }
		if json.Unmarshal(line, &ans) != nil || ans.Op != "result" || ans.Status != "success" {
			return nil, fmt.Errorf("answer %s", line)
		}
		var i int
		fmt.Sscan(ans.ID, &i)
		if ans.Fallback != "" {
			fellBack = append(fellBack, i)
			continue
		}
		if check != nil {
			if err := check(i, ans.Stdout); err != nil {
				return nil, err
			}
		}
	}
	return fellBack, nil
}
