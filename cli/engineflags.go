package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/config"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/settings"
)

// engineFlags are the flags every mode that runs an engine shares: where
// kernels run, their limits, the config and state, host tools and ssh.
type engineFlags struct {
	backends []string
	// values are the settings given by flag, by config-file key (see
	// package settings), over the config file.
	values   map[string]any
	trace    string
	config   string
	stateDir string
	keep     bool
	adopt    bool
	ssh      backends.Options // --ssh-config, --identity, --known-hosts, --accept-new-host-key
	// Host tools.
	workspace     string
	approve       string
	httpAllow     []string
	httpAllowList hosttools.AllowList // httpAllow parsed
	set           map[string]bool     // flags given on the command line
}

// settingFlags defines the flags of the settings of section, from their
// records: help with the default, and the setting's own check.
func (f *engineFlags) settingFlags(fs *flagSet, section settings.Section) {
	if f.values == nil {
		f.values = map[string]any{}
	}
	for _, set := range settings.All() {
		if set.Flag == "" || set.Section != section {
			continue
		}
		store := func(text string) error {
			v, err := set.ParseText(text)
			if err != nil {
				fs.invalid = err
				return err
			}
			f.values[set.Key] = v
			return nil
		}
		if set.Kind == settings.Bool {
			fs.BoolFunc(set.Flag, set.Help+". Config: "+set.Key+" = "+strconv.FormatBool(!set.Negated), store)
			continue
		}
		fs.Func(set.Flag, set.Help+"; "+set.Rule()+". Config: "+set.Key+" (default "+set.Default()+")", store)
	}
}

// register defines the engine flags on fs, each with its help.
func (f *engineFlags) register(fs *flagSet) {
	fs.section("Engine flags (flags override the config file):")
	fs.Func("backend", "the `URI` of a host kernels run on: local, ssh://[user@]host[:port] (host may be a Host alias from "+
		"~/.ssh/config), docker://CONTAINER[?user=U] (a running container), docker-image://IMAGE[?memory=512m&cpus=1&"+
		"pids=256&network=none&user=U] (a throwaway container per kernel, with those limits; nothing is pulled), "+
		"k8s://[CONTEXT/]NAMESPACE/POD[?container=C] (a running pod), k8s-image://IMAGE?namespace=NS[&memory=512Mi&cpu=1&"+
		"user=UID&node_selector=K=V,…&pull=IfNotPresent] (a pod per kernel, deleted when the kernel goes), or a "+
		"name from [backends] in the config file. Repeat it to offer several; the first "+
		"is used by requests that name none (default: default_backend from the config, else local)",
		func(s string) error {
			if strings.TrimSpace(s) == "" {
				return errors.New("it must be a backend URI such as local, or a name from [backends] in the config file")
			}
			f.backends = append(f.backends, s)
			return nil
		})
	f.settingFlags(fs, settings.Engine)
	fs.Bool(&f.keep, "keep-kernels", "at exit, leave the kernels running on their hosts and record them in the state dir, "+
		"so the next kerneldeck started with --keep-kernels or --adopt takes them over with their state (they exit by "+
		"themselves once idle for --idle-exit); default: exiting kills every kernel")
	fs.Bool(&f.adopt, "adopt", "take over the kernels an earlier kerneldeck left running with --keep-kernels, even without "+
		"--keep-kernels (default: only a kerneldeck started with --keep-kernels does)")
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
	f.settingFlags(fs, settings.HostTools)
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
	fs.section("Kubernetes backends (k8s://, k8s-image://) reach the API as kubectl does: KUBECONFIG (else ~/.kube/config), " +
		"the current context or the one named, and in a pod without one its own service account. The account needs get, " +
		"list and watch on pods and create on pods/exec, and for k8s-image:// create and delete on pods; no kubectl needed.")
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
