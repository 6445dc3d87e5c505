package main

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"
)

// num formats a value with about three significant digits.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v):
		return "—"
	case a == 0:
		return "0"
	case a < 0.01:
		return fmt.Sprintf("%.4f", v)
	case a < 1:
		return fmt.Sprintf("%.3f", v)
	case a < 10:
		return fmt.Sprintf("%.2f", v)
	case a < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// fig renders figure name as "median (min–max)", or a dash and why.
func fig(res *results, name string) string {
	s, ok := res.get(name)
	if !ok {
		if n := res.noteFor(name); n != "" {
			return "— (" + n + ")"
		}
		return "—"
	}
	if s.N == 1 || s.Min == s.Max {
		return num(s.Med)
	}
	return fmt.Sprintf("%s (%s–%s)", num(s.Med), num(s.Min), num(s.Max))
}

// tripsFig renders round trips per cell (from the trace for a traced
// subject, else from the Counting wrapper): total, and how many were plain
// commands and stream exchanges. The Counting wrapper's count of everything
// (Execute calls + frames written) is shown too when it differs.
func tripsFig(res *results, k, which string) string {
	total, ok := res.get(k + ".trips." + which)
	if !ok {
		return "—"
	}
	cmds, _ := res.get(k + ".exec." + which)
	s := fmt.Sprintf("%s (%s cmd + %s stream)", num(total.Med), num(cmds.Med), num(total.Med-cmds.Med))
	if c, ok := res.get(k + ".counted." + which); ok && math.Abs(c.Med-total.Med) > 1e-9 {
		s += fmt.Sprintf("; Counting: %s", num(c.Med))
	}
	return s
}

func report(w io.Writer, cfg config, m machine, env *setupEnv, res *results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	mode := "full"
	if cfg.Quick {
		mode = "quick (-quick: a smoke run, not a measurement)"
	}
	p("### kerneldeck bench, %s", cfg.Date)
	p("")
	p("- Machine: %d cores (%s), %s, %s, GOMAXPROCS %d.", m.cores, m.cpuModel, m.memory, m.kernel, m.gomaxprocs)
	p("- Load average (1, 5, 15 min): %s at the start, %s at the end (everything on the machine, this run included; ratios are taken pair by pair within each round, so that load from elsewhere hits both sides).", m.loadStart, m.loadEnd)
	soft := []string{runtime.Version(), "Python " + env.pythonVersion + " for kerneldeck's local runners and the Jupyter kernel"}
	if env.jupyter != nil {
		v := env.jupyter.info.Versions
		soft = append(soft, fmt.Sprintf("jupyter_client %s, ipykernel %s, pyzmq %s (kernel: %s)", v["jupyter_client"], v["ipykernel"], v["pyzmq"], env.jupyter.info.Executable))
	}
	if env.sshdVersion != "" {
		soft = append(soft, env.sshdVersion+" on loopback")
	}
	p("- Software: %s.", strings.Join(soft, "; "))
	p("- Run: %s; %d rounds; per round and subject %d warm cells in %d interleaved blocks (heavy-rc ssh floor: %d), after %d unmeasured ones, and %d cold start(s); took %v.",
		mode, cfg.Rounds, cfg.Warm, cfg.Blocks, min(cfg.HeavyFloor, cfg.Warm), cfg.Warmup, cfg.Cold, m.elapsed.Round(time.Second))
	p("- Every figure: median over the rounds (min–max across rounds). Times in ms.")
	p("")

	p("#### Trivial cell: warm round trip, cold start, cost")
	p("")
	p("| subject | warm p50 | warm p90 | warm p99 | cold start | round trips / warm cell | round trips / cold start | host CPU ms / warm cell |")
	p("| --- | --- | --- | --- | --- | --- | --- | --- |")
	heavy := fmt.Sprintf("%v", heavySleep)
	rows := []struct{ key, label, skip string }{
		{"local", "kerneldeck, local backend", ""},
		{"local.traced", "kerneldeck, local backend, traced as `--trace` traces (a record written per exchange)", ""},
		{"local.spare", "kerneldeck, local backend, a spare runner ready (`--spare-kernels 1`)", ""},
		{"jupyter", "Jupyter kernel (jupyter_client + ipykernel), local", "jupyter"},
		{"floor.bash", "floor: one `bash -c true`", ""},
		{"floor.pyloop", "floor: a Python loop reading a JSON line from a Unix socket, running it with stdout captured, writing a JSON line (the limit of this design; its cold start: the interpreter started from Go, the socket, one cell)", ""},
		{"floor.spawnchain", "floor: the same loop started as a spawn starts a runner (bash, a watcher subshell that stays its parent, the interpreter in the background), then its socket and one cell; a cold start only", ""},
		{"fresh.headless", "a fresh `kerneldeck headless` process to its first result, its state dir kept from run to run; a cold start only", ""},
		{"fresh.headless.userpath", "the same with the PATH the bench was started with (its python3 may be a pyenv shim)", ""},
		{"fresh.headless.history", "the same with 190 MB of event log in its state dir (8 MB in a quick run; an engine once read it all at its start)", ""},
		{"fresh.mcp", "a fresh `kerneldeck mcp` process to its first python_exec result (the MCP handshake included); a cold start only", ""},
		{"ssh.light", "kerneldeck, ssh, light shell", "ssh"},
		{"floor.ssh.light", "floor: one x/crypto/ssh exec of `true`, light shell", "ssh"},
		{"floor.ssh.streamlocal", "floor: one line echoed over a kept direct-streamlocal channel (x/crypto/ssh to a Unix socket), light shell", "ssh"},
		{"ssh.heavy", "kerneldeck, ssh, ~/.bashrc sleeps " + heavy, "ssh"},
		{"floor.ssh.heavy", "floor: one x/crypto/ssh exec of `true`, ~/.bashrc sleeps " + heavy, "ssh"},
		{"docker", "kerneldeck, docker:// (a running container, /tmp on a tmpfs)", "docker"},
		{"floor.docker", "floor: one exec of `true` through the Docker Engine API", "docker"},
		{"docker-image", "kerneldeck, docker-image:// (a container per kernel; cold start creates it)", "docker"},
		{"floor.docker.container", "floor: a docker-image:// kernel's container made and started through the API, with the backend's options; a cold start only", "docker"},
		{"headless.local", "through one `kerneldeck headless` process: local backend", "docker"},
		{"headless.docker-image", "through one `kerneldeck headless` process: docker-image:// (a new owner's cold start creates its container)", "docker"},
		{"headless.docker-image.pool", "through one `kerneldeck headless` process: docker-image:// with a pool (`--spare-kernels 1`; a new owner is handed a pool container)", "docker"},
		{"floor.k8s.pod", "floor: a k8s-image:// kernel's pod created, scheduled and started through the API, with the backend's spec, until its container runs; a cold start only", "k8s"},
		{"headless.k8s-image", "through one `kerneldeck headless` process: k8s-image:// (a new owner's cold start creates its pod)", "k8s"},
		{"headless.k8s-image.pool", "through one `kerneldeck headless` process: k8s-image:// with a pool (`--spare-kernels 1`; a new owner is handed a pool pod)", "k8s"},
	}
	for _, r := range rows {
		if why, skipped := env.skipped[r.skip]; skipped && r.skip != "" {
			p("| %s | skipped (%s) | | | | | | |", r.label, why)
			continue
		}
		cold := fig(res, r.key+".cold")
		if strings.HasPrefix(r.key, "floor.") && !slices.Contains([]string{"floor.pyloop", "floor.spawnchain", "floor.docker.container", "floor.k8s.pod"}, r.key) {
			cold = "n/a"
		}
		trips := [2]string{tripsFig(res, r.key, "warm"), tripsFig(res, r.key, "cold")}
		if !strings.HasPrefix(r.key, "local") && !strings.HasPrefix(r.key, "ssh.") && !strings.HasPrefix(r.key, "docker") || strings.HasPrefix(r.key, "headless.") {
			trips = [2]string{"n/a", "n/a"}
		}
		warm := [4]string{fig(res, r.key+".warm.p50"), fig(res, r.key+".warm.p90"), fig(res, r.key+".warm.p99"), fig(res, r.key+".cpu")}
		if strings.HasPrefix(r.key, "fresh.") || r.key == "floor.docker.container" || r.key == "floor.k8s.pod" {
			warm = [4]string{"n/a", "n/a", "n/a", "n/a"} // a cold start only
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s |", r.label, warm[0], warm[1], warm[2], cold, trips[0], trips[1], warm[3])
	}
	p("")

	p("#### Ratios, taken pair by pair within each round")
	p("")
	p("| ratio | median (min–max) |")
	p("| --- | --- |")
	for _, r := range [][2]string{
		{"ratio.local_jupyter.warm", "kerneldeck local warm p50 ÷ Jupyter warm p50"},
		{"ratio.local_jupyter.cold", "kerneldeck local cold start ÷ Jupyter cold start"},
		{"ratio.freshheadless_jupyter.cold", "a fresh `kerneldeck headless` to its first result ÷ the Jupyter kernel's cold start"},
		{"ratio.local_bash.warm", "kerneldeck local warm p50 ÷ `bash -c true`"},
		{"ratio.localspare_jupyter.cold", "kerneldeck local cold start with a spare runner ready ÷ Jupyter cold start (issue 18: at most 0.01)"},
		{"ratio.sshlight_streamlocal.warm", "kerneldeck ssh (light) warm p50 ÷ a line echoed over direct-streamlocal (issue 18: at most 1.5)"},
		{"ratio.sshlight_streamlocal.b2b", "the same ratio from cells run back to back, one run per subject and round (no pause before each block: what the pauses add; the target is judged on the row above)"},
		{"ratio.local_pyloop.warm", "kerneldeck local warm p50 ÷ the Python exec loop on a Unix socket (issue 18: at most 4)"},
		{"ratio.local_pyloop.b2b", "the same ratio from cells run back to back, one run per subject and round (the target is judged on the row above)"},
		{"ratio.local_pyloop.cold", "kerneldeck local cold start without a spare ÷ the Python exec loop's cold start (what the spawn adds to the interpreter's start)"},
		{"ratio.spawnchain_pyloop.cold", "the exec loop's cold start through a spawn's bash and watcher ÷ started from Go (what the shell and its forks cost on this machine)"},
		{"ratio.local_spawnchain.cold", "kerneldeck local cold start without a spare ÷ the exec loop's through a spawn's bash and watcher (kerneldeck's own share: the runner's setup, confinement, authentication)"},
		{"ratio.localtraced_local.warm", "kerneldeck local warm p50 traced as `--trace` traces ÷ untraced (what tracing costs a cell)"},
		{"ratio.sshlight_jupyter.warm", "kerneldeck ssh (light) warm p50 ÷ Jupyter (local) warm p50"},
		{"ratio.sshlight_floor.warm", "kerneldeck ssh warm p50 ÷ raw ssh exec, light shell"},
		{"ratio.sshheavy_floor.warm", "kerneldeck ssh warm p50 ÷ raw ssh exec, heavy rc"},
		{"ratio.sshheavy_light.warm", "kerneldeck ssh warm p50: heavy rc ÷ light shell"},
		{"ratio.floorheavy_light.warm", "raw ssh exec: heavy rc ÷ light shell (what the rc costs a command)"},
		{"ratio.docker_local.warm", "kerneldeck docker:// warm p50 ÷ local warm p50"},
		{"ratio.docker_floor.warm", "kerneldeck docker:// warm p50 ÷ one `docker exec true` through the API"},
		{"ratio.dockerimage_jupyter.cold", "kerneldeck docker-image:// cold start (container create + spawn + first result) ÷ Jupyter cold start"},
		{"ratio.docker_jupyter.cold", "kerneldeck docker:// cold start ÷ Jupyter cold start"},
		{"ratio.headless_dockerimage_local.warm", "through headless: docker-image:// warm p50 ÷ local warm p50"},
		{"ratio.headless_k8simage_local.warm", "through headless: k8s-image:// warm p50 ÷ local warm p50"},
		{"ratio.headless_k8simage_dockerimage.warm", "through headless: k8s-image:// warm p50 ÷ docker-image:// warm p50"},
		{"diff.headless_k8simage_pod.cold", "through headless: a new owner's k8s-image:// first result without a pool − the pod's create, schedule and start alone (ms: kerneldeck's own share)"},
		{"diff.headless_dockerimage_container.cold", "through headless: a new owner's docker-image:// first result without a pool − the container's create and start alone (ms: kerneldeck's own share, the spawn in the container and the first cell)"},
	} {
		p("| %s | %s |", r[1], fig(res, r[0]))
	}
	p("")

	p("#### A cell making 100 tool calls (trivial host tool), latency of one call as the kernel sees it")
	p("")
	p("| backend | call p50 | call p90 | call p99 | whole cell ÷ 100 |")
	p("| --- | --- | --- | --- | --- |")
	for _, b := range [][2]string{{"local", "local"}, {"ssh.light", "ssh, light shell"}} {
		k := "tools." + b[0]
		p("| %s | %s | %s | %s | %s |", b[1], fig(res, k+".p50"), fig(res, k+".p90"), fig(res, k+".p99"), fig(res, k+".cell"))
	}
	p("")

	p("#### Memory of an idle kernel (VmRSS, MB)")
	p("")
	p("| process | MB |")
	p("| --- | --- |")
	p("| kerneldeck's local runner, after its warm cells | %s |", fig(res, "rss.local"))
	p("| a bare interpreter (`%s -c 'time.sleep(...)'`) | %s |", cfg.Python, fig(res, "rss.bare"))
	p("| the runner over the bare interpreter (issue 18: at most 2) | %s |", fig(res, "rss.local_over_bare"))
	p("| the ipykernel | %s |", fig(res, "rss.jupyter"))
	p("")

	p("#### A warm local cell that displays a 100 KB PNG, beside a trivial one (interleaved, one kernel)")
	p("")
	p("| cell | p50 ms |")
	p("| --- | --- |")
	p("| `1` | %s |", fig(res, "displays.trivial"))
	p("| `display(img)`, a 100 KB `image/png` in the result | %s |", fig(res, "displays.png100k"))
	p("| the display's cost (difference of the p50s; budget 2 ms) | %s |", fig(res, "displays.extra"))
	p("")

	p("#### %d owners running cells at once on one ssh host (light shell, one shared connection)", cfg.Owners)
	p("")
	p("| burst | wall ms or cells/s | p50 | p99 | failures per round |")
	p("| --- | --- | --- | --- | --- |")
	p("| %d first cells at once (each spawns its kernel) | %s ms | %s | %s | %s |", cfg.Owners, fig(res, "owners.cold.wall"),
		fig(res, "owners.cold.p50"), fig(res, "owners.cold.p99"), fig(res, "owners.cold.fail"))
	p("| %d warm cells at once (%d per owner) | %s cells/s | %s | %s | %s |", cfg.Owners*cfg.OwnerCells, cfg.OwnerCells,
		fig(res, "owners.warm.tput"), fig(res, "owners.warm.p50"), fig(res, "owners.warm.p99"), fig(res, "owners.warm.fail"))
	p("")

	p("#### Scale on one host: real local kernels")
	p("")
	p("| figure | value |")
	p("| --- | --- |")
	p("| %d new owners at once: until every one has its first result (ms) | %s |", cfg.Storm, fig(res, "host.storm.wall"))
	p("| the same, one owner's first result (p50, ms) | %s |", fig(res, "host.storm.p50"))
	p("| %d owners × 10 warm cells at once (cells/s) | %s |", cfg.Storm, fig(res, "host.warm.per_s"))
	p("| the same, a cell's round trip (p50 / p99, ms) | %s / %s |", fig(res, "host.warm.p50"), fig(res, "host.warm.p99"))
	p("| failed cells per round (storm, warm) | %s, %s |", fig(res, "host.storm.fail"), fig(res, "host.warm.fail"))
	p("| kernels then held idle | %s |", fig(res, "host.idle.kernels"))
	p("| the engine's CPU while they idle (%% of a core) | %s |", fig(res, "host.idle.engine_cpu_pct"))
	p("| the engine's resident memory (the bench's process, MB) | %s |", fig(res, "host.idle.engine_rss_mb"))
	p("| one idle runner's resident memory (median, MB) | %s |", fig(res, "host.idle.runner_rss_mb"))
	p("| processes of the kernels left after Close | %s |", fig(res, "host.left"))
	p("")

	p("#### %s hibernated sessions on one host", thousands(cfg.Sessions))
	p("")
	p("Each session ran one cell that left 50 names of 2 KB (100 KB) and hibernated after 1 s idle; the stream")
	p("calls random sessions at %d a second (each call wakes its session, restores it and runs a cell that reads two names).", cfg.WakeRate)
	p("")
	p("| figure | value |")
	p("| --- | --- |")
	p("| sessions made, a second (4 at a time, each spawning its kernel) | %s |", fig(res, "hibernate.make.per_s"))
	p("| sessions then hibernated | %s |", fig(res, "hibernate.sessions"))
	p("| resident memory of all of it: the engine (the bench's process) + its spare runners (MB) | %s + %s = %s |",
		fig(res, "hibernate.rss.engine_mb"), fig(res, "hibernate.rss.runners_mb"), fig(res, "hibernate.rss.total_mb"))
	p("| their parked states on disk (MB) | %s |", fig(res, "hibernate.park_mb"))
	p("| the engine's CPU while they sleep (%% of a core) | %s |", fig(res, "hibernate.idle_cpu_pct"))
	p("| a call to a random session, from when it was due (p50 / p99, ms) | %s / %s |", fig(res, "hibernate.wake.p50"), fig(res, "hibernate.wake.p99"))
	p("| failed calls per round of %d | %s |", cfg.WakeCalls, fig(res, "hibernate.wake.fail"))
	p("| one session's wake and cell, nothing else going on: a namespace of 1 MB / 200 MB (ms) | %s / %s |",
		fig(res, "hibernate.wake_1mb"), fig(res, "hibernate.wake_200mb"))
	p("| the same per GB of namespace (from the 200 MB one; E2B publishes about 1 s to resume a sandbox) | %s |", fig(res, "hibernate.wake_per_gb"))
	p("| processes of the kernels left after Close | %s |", fig(res, "hibernate.left"))
	p("")

	p("#### Engine overhead with %s registered kernels (idle, on a fake host: no processes)", thousands(cfg.Kernels))
	p("")
	p("| figure | ms |")
	p("| --- | --- |")
	p("| warm local cell, engine holding no other kernel (p50) | %s |", fig(res, "scale.cell.base"))
	p("| warm local cell, engine holding %s kernels (p50) | %s |", thousands(cfg.Kernels), fig(res, "scale.cell.loaded"))
	p("| per-call overhead of the %s kernels (reap, cap, lookup; median of paired differences) | %s |", thousands(cfg.Kernels), fig(res, "scale.overhead"))
	p("| one reap + cap sweep over the registry (`SetLimits` with no change) | %s |", fig(res, "scale.sweep"))
	p("| one `Kernels()` snapshot (the dashboard takes one per second) | %s |", fig(res, "scale.kernels"))
	p("| one dashboard `View()`, 160×50 | %s |", fig(res, "scale.view"))
	p("| a new dashboard's first frame: `ui.New` (snapshot + grouping, as each 1 s tick refreshes) + `View()` | %s |", fig(res, "scale.uinew"))
	p("| registering one kernel while they fill up (mean) | %s |", fig(res, "scale.register"))
	p("")

	p("#### The shared engine: `kerneldeck serve` with clients")
	p("")
	p("| figure | value |")
	p("| --- | --- |")
	p("| warm cell through an embedded `kerneldeck headless` (p50, ms) | %s |", fig(res, "serve.embedded.p50"))
	p("| warm cell through `kerneldeck headless --connect` to `kerneldeck serve` (p50, ms) | %s |", fig(res, "serve.connect.p50"))
	p("| what --connect adds (difference of the p50s, ms) | %s |", fig(res, "serve.connect.extra"))
	p("| warm cell through `headless --connect --no-reconnect` (the engine takes the pipes over; p50, ms) | %s |", fig(res, "serve.connect_no_reconnect.p50"))
	p("| what --connect --no-reconnect adds (difference of the p50s, ms) | %s |", fig(res, "serve.connect_no_reconnect.extra"))
	p("| warm `python_exec` through `kerneldeck mcp` on stdio, the MCP SDK's client (p50, ms) | %s |", fig(res, "serve.mcp.p50"))
	p("| what MCP adds over the embedded headless (difference of the p50s, ms) | %s |", fig(res, "serve.mcp.extra"))
	p("| engine CPU with 1,000 kernels, no dashboard (%% of a core) | %s |", fig(res, "serve.cpu.idle"))
	p("| what one attached dashboard adds (%% of a core) | %s |", fig(res, "serve.cpu.one"))
	p("| what ten attached dashboards add (%% of a core) | %s |", fig(res, "serve.cpu.ten"))
	p("| warm local cell with no dashboard attached (p50, ms) | %s |", fig(res, "serve.cell.none"))
	p("| warm local cell with ten attached (p50, ms) | %s |", fig(res, "serve.cell.ten"))
	p("")

	p("#### An engine restart: `kerneldeck serve` killed with SIGKILL and started again on the same state dir")
	p("")
	p("| figure | value |")
	p("| --- | --- |")
	p("| kernels the killed engine held (local, each with x set) | %d |", cfg.RestartKernels)
	p("| from the new serve's start until it serves, having taken them back (ms) | %s |", fig(res, "restart.serving_ms"))
	p("| from the new serve's start until every kernel answered a cell with its state (ms) | %s |", fig(res, "restart.usable_ms"))
	p("| one agent's calls in a loop across the restart, `headless --connect` (p50, ms) | %s |", fig(res, "restart.agent.p50"))
	p("| the same (p99, ms) | %s |", fig(res, "restart.agent.p99"))
	p("| the same, the longest call: the one the restart held up (ms) | %s |", fig(res, "restart.agent.max"))
	p("")

	p("#### The dashboard's own CPU: the real binary attached in tmux (160×50) to an engine holding 1,000 kernels")
	p("")
	p("| figure | value |")
	p("| --- | --- |")
	p("| nothing changes, the editor focused (%% of a core) | %s |", fig(res, "dashboard.cpu.idle"))
	p("| one cell streaming a line every 20 ms, its kernel selected (%% of a core) | %s |", fig(res, "dashboard.cpu.stream"))
	p("")

	p("#### Targets (issues 6, 13, 14, 16 and 18)")
	p("")
	p("| target | measured | |")
	p("| --- | --- | --- |")
	for _, tg := range targets(cfg, env, res) {
		p("| %s | %s | %s |", tg.what, tg.measured, tg.verdict)
	}
	if len(res.errors) > 0 {
		p("")
		p("Failures:")
		p("")
		for _, e := range res.errors {
			p("- %s", strings.ReplaceAll(e, "\n", " "))
		}
	}
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

type target struct{ what, measured, verdict string }

// worse is the worse of two verdicts.
func worse(a, b string) string {
	for _, v := range []string{"**missed**", "not measured"} {
		if a == v || b == v {
			return v
		}
	}
	if a != "met" {
		return a
	}
	return b
}

// verdict judges a figure whose median must be at most limit: met, met
// with a note when some round was over, or missed.
func verdict(res *results, name string, limit float64) string {
	s, ok := res.get(name)
	if !ok {
		return "not measured"
	}
	switch {
	case s.Med > limit:
		return "**missed**"
	case s.Max > limit:
		return fmt.Sprintf("met (median; %d rounds, worst %s)", s.N, num(s.Max))
	}
	return "met"
}

func targets(cfg config, env *setupEnv, res *results) []target {
	var out []target
	out = append(out,
		target{"local warm cell ≤ 0.5× the Jupyter kernel's (p50 ÷ p50)", fig(res, "ratio.local_jupyter.warm"), verdict(res, "ratio.local_jupyter.warm", 0.5)},
		target{"local cold start ≤ 0.1× the Jupyter kernel's", fig(res, "ratio.local_jupyter.cold"), verdict(res, "ratio.local_jupyter.cold", 0.1)},
		target{fmt.Sprintf("local cold start without a spare ≤ 1.15× the spawn's own chain (the exec loop started through a spawn's bash and watcher, %s ms here; from Go, %s ms)",
			num(mustMed(res, "floor.spawnchain.cold")), num(mustMed(res, "floor.pyloop.cold"))), fig(res, "ratio.local_spawnchain.cold"), verdict(res, "ratio.local_spawnchain.cold", 1.15)},
		target{"a fresh `kerneldeck headless` to its first result ≤ 100 ms, with the bench's python3 and with the PATH's (a pyenv shim included)",
			fig(res, "fresh.headless.cold") + "; " + fig(res, "fresh.headless.userpath.cold"),
			worse(verdict(res, "fresh.headless.cold", 100), verdict(res, "fresh.headless.userpath.cold", 100))},
		target{"a fresh `kerneldeck mcp` to its first result ≤ 100 ms", fig(res, "fresh.mcp.cold"), verdict(res, "fresh.mcp.cold", 100)},
		target{"a fresh `kerneldeck headless` with 190 MB of event log (8 MB in a quick run) ≤ 1.25× (+10 ms) one with none, in the same run", fig(res, "fresh.headless.history.cold"),
			verdict(res, "fresh.headless.history.cold", 1.25*mustMed(res, "fresh.headless.cold")+10)},
		target{"a fresh `kerneldeck headless` ≤ 0.1× the Jupyter kernel's cold start", fig(res, "ratio.freshheadless_jupyter.cold"), verdict(res, "ratio.freshheadless_jupyter.cold", 0.1)},
		target{"local cold start with a spare runner ready ≤ 10 ms", fig(res, "local.spare.cold"), verdict(res, "local.spare.cold", 10)},
		target{"ssh warm cell (light shell) within 2× the raw x/crypto/ssh exec floor", fig(res, "ratio.sshlight_floor.warm"), verdict(res, "ratio.sshlight_floor.warm", 2)},
		target{fmt.Sprintf("ssh warm cell independent of shell rc cost: heavy rc ÷ light ≤ 1.5 (the %v rc alone makes a raw exec %s× slower)",
			heavySleep, num(mustMed(res, "ratio.floorheavy_light.warm"))), fig(res, "ratio.sshheavy_light.warm"), verdict(res, "ratio.sshheavy_light.warm", 1.5)},
		target{"docker:// warm cell within 1.5× the local backend's", fig(res, "ratio.docker_local.warm"), verdict(res, "ratio.docker_local.warm", 1.5)},
		target{"docker:// warm cell under 0.3× one `docker exec true` through the API", fig(res, "ratio.docker_floor.warm"), verdict(res, "ratio.docker_floor.warm", 0.3)},
		target{"through headless, a docker-image:// warm cell ≤ 1.5× a local one", fig(res, "ratio.headless_dockerimage_local.warm"), verdict(res, "ratio.headless_dockerimage_local.warm", 1.5)},
		target{fmt.Sprintf("through headless, a new owner's docker-image:// kernel without a pool: first result ≤ 400 ms (its container's create and start alone: %s ms here)", num(mustMed(res, "floor.docker.container.cold"))),
			fig(res, "headless.docker-image.cold"), verdict(res, "headless.docker-image.cold", 400)},
		target{"through headless, a new owner's docker-image:// kernel with a pool: first result ≤ 25 ms p50, ≤ 60 ms p95 (published, not measured here: Daytona 110 ms p50 / 280 ms p95, E2B 440 / 850 ms, Modal 2.66 / 11.8 s, ComputeSDK April 2026)",
			fig(res, "headless.docker-image.pool.cold") + "; p95 " + fig(res, "headless.docker-image.pool.cold.p95"),
			worse(verdict(res, "headless.docker-image.pool.cold", 25), verdict(res, "headless.docker-image.pool.cold.p95", 60))},
	)
	var trips []string
	worst := math.NaN()
	for _, k := range []string{"local", "ssh.light", "ssh.heavy", "docker", "docker-image"} {
		if s, ok := res.get(k + ".trips.warm"); ok {
			trips = append(trips, k+" "+num(s.Max))
			if math.IsNaN(worst) || s.Max > worst {
				worst = s.Max
			}
		}
	}
	tv := "not measured"
	if !math.IsNaN(worst) {
		tv = "met"
		if worst > 1 {
			tv = "**missed**"
		}
	}
	out = append(out, target{"1 backend round trip per warm cell (most in any round)", strings.Join(trips, ", "), tv})
	out = append(out,
		target{"a warm cell through headless --connect costs at most 0.1 ms more at p50 than through an embedded headless",
			fig(res, "serve.connect.extra"), verdict(res, "serve.connect.extra", 0.1)},
		target{"one attached dashboard on an engine holding 1,000 kernels costs it under 1% of a core",
			fig(res, "serve.cpu.one"), verdict(res, "serve.cpu.one", 1)},
		target{"a warm python_exec over MCP stdio costs at most 0.3 ms more at p50 than the same cell over headless",
			fig(res, "serve.mcp.extra"), verdict(res, "serve.mcp.extra", 0.3)},
		target{"an idle dashboard showing 1,000 kernels uses under 0.5% of a core",
			fig(res, "dashboard.cpu.idle"), verdict(res, "dashboard.cpu.idle", 0.5)},
		target{"a dashboard showing 1,000 kernels with one cell streaming uses under 5% of a core",
			fig(res, "dashboard.cpu.stream"), verdict(res, "dashboard.cpu.stream", 5)})
	if _, ok := res.get("host.idle.kernels"); ok {
		out = append(out, target{fmt.Sprintf("the engine idles at ≤ 1%% of a core with %s real local kernels", thousands(cfg.HostKernels)),
			fig(res, "host.idle.engine_cpu_pct"), verdict(res, "host.idle.engine_cpu_pct", 1)})
		limit := "not measured (no local cold start)"
		if cold, ok := res.get("local.cold"); ok {
			bound := 2 * float64(cfg.Storm) * cold.Med / float64(runtime.NumCPU())
			limit = verdict(res, "host.storm.wall", bound)
			limit += fmt.Sprintf(" (bound %s ms: 2 × %d × %s ms ÷ %d cores)", num(bound), cfg.Storm, num(cold.Med), runtime.NumCPU())
		}
		out = append(out, target{fmt.Sprintf("%d new owners at once done within 2 × (%d × a cold start ÷ cores)", cfg.Storm, cfg.Storm),
			fig(res, "host.storm.wall"), limit})
		bad := sum(res, "host.storm.fail") + sum(res, "host.warm.fail") + sum(res, "host.idle.fail") + sum(res, "host.left")
		v := "met"
		if bad > 0 {
			v = "**missed**"
		}
		out = append(out, target{"on one host: no failed cell, no runner left after Close",
			fmt.Sprintf("%s failed or left", num(bad)), v})
	}
	if _, ok := res.get("hibernate.sessions"); ok {
		n := thousands(cfg.Sessions)
		out = append(out,
			target{n + " hibernated sessions hold at most 2 GB of RAM in all", fig(res, "hibernate.rss.total_mb") + " MB",
				verdict(res, "hibernate.rss.total_mb", 2048)},
			target{fmt.Sprintf("a call to a random one of %s hibernated sessions, %d calls a second: p50 ≤ 30 ms", n, cfg.WakeRate),
				fig(res, "hibernate.wake.p50"), verdict(res, "hibernate.wake.p50", 30)},
			target{"the same, p99 ≤ 100 ms", fig(res, "hibernate.wake.p99"), verdict(res, "hibernate.wake.p99", 100)},
			target{"a hibernated session with 1 MB of namespace wakes at a spare's pace: its call ≤ 15 ms", fig(res, "hibernate.wake_1mb"),
				verdict(res, "hibernate.wake_1mb", 15)},
			target{"the engine idles at ≤ 1% of a core with " + n + " hibernated sessions",
				fig(res, "hibernate.idle_cpu_pct"), verdict(res, "hibernate.idle_cpu_pct", 1)})
		bad := sum(res, "hibernate.wake.fail") + sum(res, "hibernate.left")
		v := "met"
		if bad > 0 || res.failedPrefix("hibernate") {
			v = "**missed**"
		}
		out = append(out, target{n + " hibernated sessions: no failed call, no runner left after Close",
			fmt.Sprintf("%s failed or left", num(bad)), v})
	}
	if _, ok := res.get("owners.cold.fail"); ok {
		fails := sum(res, "owners.cold.fail") + sum(res, "owners.warm.fail")
		v := "met"
		if fails > 0 {
			v = "**missed**"
		}
		out = append(out, target{fmt.Sprintf("%d concurrent owners on one host with no failure", cfg.Owners),
			fmt.Sprintf("%s failed cells in %d rounds", num(fails), cfg.Rounds), v})
	} else {
		why := res.noteFor("owners.cold.fail")
		if why == "" {
			why = "failed"
		}
		out = append(out, target{fmt.Sprintf("%d concurrent owners on one host with no failure", cfg.Owners), "—", "not measured (" + why + ")"})
	}
	return out
}

func mustMed(res *results, name string) float64 {
	s, ok := res.get(name)
	if !ok {
		return math.NaN()
	}
	return s.Med
}

func sum(res *results, name string) float64 {
	res.mu.Lock()
	defer res.mu.Unlock()
	t := 0.0
	for _, v := range res.vals[name] {
		t += v
	}
	return t
}
