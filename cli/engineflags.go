package cli

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/config"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/bytesize"
)

// engineFlags are the flags every mode that runs an engine shares: where
// kernels run, their limits, the config and state, host tools and ssh.
type engineFlags struct {
	backends     []string
	maxKernels   int
	perOwner     int
	idleExit     time.Duration
	cellTimeout  time.Duration
	trace        string
	config       string
	stateDir     string
	keep         bool
	adopt        bool
	noConfine    bool
	limits       engine.KernelLimits
	spareKernels int
	ssh          backends.Options // --ssh-config, --identity, --known-hosts, --accept-new-host-key
	// Host tools.
	workspace       string
	maxToolCalls    int
	approve         string
	approvalTimeout time.Duration
	httpAllow       []string
	httpAllowList   hosttools.AllowList // httpAllow parsed
	set             map[string]bool     // flags given on the command line
}

// register defines the engine flags on fs, each with its help.
func (f *engineFlags) register(fs *flagSet) {
	fs.section("Engine flags (flags override the config file):")
	fs.Func("backend", "the `URI` of a host kernels run on: local, ssh://[user@]host[:port] (host may be a Host alias from "+
		"~/.ssh/config), docker://CONTAINER[?user=U] (a running container), docker-image://IMAGE[?memory=512m&cpus=1&"+
		"pids=256&network=none&user=U] (a throwaway container per kernel, with those limits; nothing is pulled), or a "+
		"name from [backends] in the config file. Repeat it to offer several; the first "+
		"is used by requests that name none (default: default_backend from the config, else local)",
		func(s string) error {
			if strings.TrimSpace(s) == "" {
				return errors.New("it must be a backend URI such as local, or a name from [backends] in the config file")
			}
			f.backends = append(f.backends, s)
			return nil
		})
	fs.Func("max-kernels", "at most `N` kernels at once; beyond that the least recently used idle kernel is killed (default 4)",
		wholeNumber(&f.maxKernels, 1, math.MaxInt, "it must be a whole number >= 1, e.g. --max-kernels 4"))
	fs.Func("max-kernels-per-owner", "at most `N` kernels of one owner; an owner at it gives up its own least recently used idle "+
		"kernel for a new one (default 0: no bound, but an --allow-group member's owner gets a quarter of --max-kernels)",
		wholeNumber(&f.perOwner, 0, math.MaxInt32, "it must be a whole number >= 0 (0: no bound), e.g. --max-kernels-per-owner 2"))
	fs.Func("idle-exit", "kill kernels idle for longer than this, as a Go `DURATION` such as 30m or 1h; at least 1s (default 30m)",
		durationAtLeast(&f.idleExit, time.Second, "--idle-exit 30m"))
	fs.Func("cell-timeout", "timeout of a cell whose request gives none, as a Go `DURATION` such as 300s or 5m; the cell is "+
		"interrupted, and its kernel killed if it does not stop (default 5m)",
		func(s string) error {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 {
				return errors.New("it must be a positive Go duration, e.g. --cell-timeout 300s")
			}
			f.cellTimeout = d
			return nil
		})
	fs.Bool(&f.keep, "keep-kernels", "at exit, leave the kernels running on their hosts and record them in the state dir, "+
		"so the next kerneldeck started with --keep-kernels or --adopt takes them over with their state (they exit by "+
		"themselves once idle for --idle-exit); default: exiting kills every kernel")
	fs.Bool(&f.adopt, "adopt", "take over the kernels an earlier kerneldeck left running with --keep-kernels, even without "+
		"--keep-kernels (default: only a kerneldeck started with --keep-kernels does)")
	fs.Bool(&f.noConfine, "no-confine", "let runners skip confining themselves with Landlock (confine_kernels = false in "+
		"the config does the same). Confined, a kernel cannot reach other kernels' dirs, nor files created directly "+
		"in the temp dir after it started (its TMPDIR is a private dir); the other protections between kernels hold either way")
	fs.Func("kernel-memory", "limit each kernel's address space to this `SIZE`, such as 512MiB (at least 32MiB; "+
		"kernel_memory in the config): a cell that allocates past it gets MemoryError and the kernel keeps its state",
		func(s string) error {
			n, err := bytesize.Parse(s)
			if err != nil || n < 32<<20 {
				return errors.New("it must be a size of at least 32MiB, e.g. --kernel-memory 512MiB")
			}
			f.limits.Memory = n
			return nil
		})
	fs.Func("kernel-cpu-time", "limit the CPU time of each kernel (its runner and what it starts) to this `DURATION`, "+
		"at least 1s (kernel_cpu_time in the config); past it the kernel is killed by SIGXCPU and says so",
		durationAtLeast(&f.limits.CPUTime, time.Second, "--kernel-cpu-time 10m"))
	fs.Func("spare-kernels", "keep `N` runners started and idle on each backend, not yet anyone's kernel, so that a new "+
		"kernel starts at once (spare_kernels in the config; default 1 on the local backend, 0 on "+
		"the others; spares count toward --max-kernels and go first when it is reached)",
		wholeNumber(&f.spareKernels, 0, 64, "it must be a whole number from 0 to 64, e.g. --spare-kernels 1 (0: none)"))
	fs.Func("kernel-max-procs", "limit the processes of each kernel's login on its host to `N`, at least 8 "+
		"(kernel_max_procs in the config; an rlimit, so it counts every process of that login there, and root is exempt)",
		wholeNumber(&f.limits.MaxProcs, 8, math.MaxInt, "it must be a whole number of at least 8, e.g. --kernel-max-procs 64"))
	fs.Path(&f.config, "config", "TOML config `FILE` (default $XDG_CONFIG_HOME/kerneldeck/config.toml, or "+
		"~/.config/kerneldeck/config.toml); it must exist when given here")
	fs.Path(&f.stateDir, "state-dir", "where the full output of clipped cells (spill/), large tool results "+
		"(tool-output/) and kept kernels are recorded, created 0700 (default $XDG_STATE_HOME/kerneldeck, or "+
		"~/.local/state/kerneldeck); `DIR` must be yours")
	fs.Path(&f.trace, "trace", "append one JSON line per backend command to `FILE` (created 0600): time, backend, "+
		"command, rc, ms; never what the command got on stdin")

	fs.section("Host tools (code in a kernel whose cell lists them in \"tools\" calls them on this machine: " +
		"read_file, write_file, list_files, terminal, http_get):")
	fs.Path(&f.workspace, "workspace", "the `DIR` read_file, write_file, list_files and terminal are confined to; it "+
		"must exist (default: workspace from the config, else the current directory)")
	fs.Func("max-tool-calls", "at most `N` tool calls per cell; later calls in the cell get a \"limit reached\" answer. "+
		"0 allows none (default 50)",
		wholeNumber(&f.maxToolCalls, 0, 1<<20, "it must be a whole number >= 0 (0 allows no tool calls), e.g. --max-tool-calls 50"))
	fs.Func("http-allow", "where http_get may connect: a `HOST` name, an IP address or a CIDR prefix such as "+
		"10.0.0.0/8. Repeat it for several; the list replaces http_allow from the config and the default, loopback "+
		"only (localhost, 127.0.0.0/8, ::1). A host name is allowed only when every address it resolves to is allowed "+
		"too, so list its addresses or prefix as well",
		func(s string) error {
			if strings.TrimSpace(s) == "" {
				return errors.New(`it must be a host name, IP address or CIDR prefix, e.g. --http-allow 10.0.0.0/8; to forbid http_get, set http_get = "deny" under [approvals] in the config`)
			}
			f.httpAllow = append(f.httpAllow, s)
			return nil
		})
	fs.Func("approve", "`all|ask|none`: one policy for every tool call by every owner, replacing approve and every "+
		"[approvals] rule from the config: all runs every call, ask asks the operator for each, none refuses every call",
		func(s string) error {
			if !config.ValidApprove(s) {
				return errors.New("it must be all (every tool call runs), ask (every call asks the operator) or none (every call is refused)")
			}
			f.approve = s
			return nil
		})
	fs.Func("approval-timeout", "how long a call that asks waits for an answer before it is denied, a `DURATION` of at "+
		"least 1s (default 60s)", durationAtLeast(&f.approvalTimeout, time.Second, "--approval-timeout 60s"))

	fs.section("SSH backends (ssh://[user@]host[:port], host may be a Host alias):")
	fs.Path(&f.ssh.SSHConfig, "ssh-config", "OpenSSH client config `FILE` to read Host aliases from (default "+
		"~/.ssh/config): HostName, User, Port, IdentityFile, IdentitiesOnly, UserKnownHostsFile, ProxyJump (one hop), "+
		"ServerAliveInterval")
	fs.Path(&f.ssh.SSHIdentity, "identity", "private key `FILE` to use instead of IdentityFile; keys in ssh-agent "+
		"(SSH_AUTH_SOCK) are offered too. An encrypted key must be loaded with ssh-add")
	fs.Path(&f.ssh.SSHKnownHosts, "known-hosts", "known_hosts `FILE` instead of UserKnownHostsFile (default "+
		"~/.ssh/known_hosts). Host keys are always checked: an unknown host is refused, a changed key is refused loudly")
	fs.Bool(&f.ssh.AcceptNewHostKey, "accept-new-host-key", "record the key of a host seen for the first time "+
		"(like OpenSSH's StrictHostKeyChecking=accept-new); a changed key is still refused")

	// A section with no flags of its own: what the docker backends read.
	fs.section("Docker backends (docker://CONTAINER, docker-image://IMAGE) reach the Docker Engine API as the docker " +
		"CLI does: DOCKER_HOST (default the local socket), with TLS from DOCKER_CERT_PATH when DOCKER_TLS_VERIFY is set; " +
		"no docker command is needed on the PATH.")
}

// wholeNumber reads a flag's whole number from lo to hi into dst; msg says
// what to write instead.
func wholeNumber(dst *int, lo, hi int, msg string) func(string) error {
	return func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			return errors.New(msg)
		}
		*dst = n
		return nil
	}
}

func durationAtLeast(dst *time.Duration, least time.Duration, example string) func(string) error {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < least {
			return fmt.Errorf("it must be a Go duration of at least %v, e.g. %s", least, example)
		}
		*dst = d
		return nil
	}
}

// parsed finishes the flags once fs parsed them: it records which were given
// and checks the values that need the others.
func (f *engineFlags) parsed(set map[string]bool) error {
	f.set = set
	if set["http-allow"] {
		var err error
		if f.httpAllowList, err = config.ParseAllowList(f.httpAllow); err != nil {
			return fmt.Errorf("--http-allow: %w", err)
		}
	}
	return nil
}
