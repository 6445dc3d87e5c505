// Package cli is kerneldeck's command line: one file per mode (the
// dashboard, headless, repl), each with its own flags beside the engine
// flags they share, and --help generated from the flag definitions.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// Exit statuses: 2 is for a command line or config the user must fix.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// closeTimeout bounds killing every kernel at exit, so a hung host cannot
// keep the process alive forever.
const closeTimeout = 30 * time.Second

// stdio is what a mode reads and writes.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// mode is one way to run kerneldeck. Adding a mode is adding one of these to
// modes, in a file of its own.
type mode struct {
	// name is the command word; "" is the dashboard (no command).
	name string
	// summary is its line in the usage list.
	summary string
	// help writes the mode's --help.
	help func(w io.Writer)
	// run runs the mode with its arguments and returns the exit status.
	run func(args []string, std stdio) int
}

// command is one run of a mode: its flags and what it does.
type command interface {
	flags() *flagSet
	run(args []string, std stdio, help func(io.Writer)) int
}

// newMode makes a mode whose --help is intro, its flags and epilogue, and
// whose runs are made by cmd.
func newMode(name, summary, intro, epilogue string, cmd func() command) mode {
	help := func(w io.Writer) {
		fmt.Fprint(w, intro)
		cmd().flags().writeHelp(w)
		fmt.Fprint(w, epilogue)
	}
	return mode{name: name, summary: summary, help: help,
		run: func(args []string, std stdio) int { return cmd().run(args, std, help) }}
}

// modes lists every mode, the dashboard first.
func modes() []mode {
	return []mode{dashboardMode(), headlessMode(), replMode(), serveMode(), mcpMode(), eventsMode()}
}

// Run is main without the process: it runs the command line args and
// returns the exit status.
func Run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	std := stdio{in: stdin, out: stdout, err: stderr}
	all := modes()
	if len(args) == 0 || (strings.HasPrefix(args[0], "-") && !isHelpOrVersion(args[0])) {
		return all[0].run(args, std)
	}
	switch args[0] {
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	case "help", "--help", "-help", "-h":
		if len(args) > 1 {
			for _, m := range all {
				if args[1] == m.name || (m.name == "" && args[1] == "dashboard") {
					m.help(stdout)
					return exitOK
				}
			}
			if args[1] != "version" && args[1] != "help" {
				fmt.Fprintf(stderr, "kerneldeck help: no command %q; help knows dashboard, %s.\nRun 'kerneldeck --help' for usage.\n",
					args[1], strings.Join(commandNames(all), ", "))
				return exitUsage
			}
		}
		writeUsage(stdout, all)
		return exitOK
	}
	for _, m := range all[1:] {
		if args[0] == m.name {
			return m.run(args[1:], std)
		}
	}
	fmt.Fprintf(stderr, "kerneldeck: unknown command %q; the commands are %s, version and help (no command opens the dashboard).\nRun 'kerneldeck --help' for usage.\n",
		args[0], strings.Join(commandNames(all), ", "))
	return exitUsage
}

// commandNames are the commands' names (the dashboard has none).
func commandNames(all []mode) []string {
	var names []string
	for _, m := range all[1:] {
		names = append(names, m.name)
	}
	return names
}

// usageDescAt is the description column of the usage list.
const usageDescAt = 32

// writeUsage is `kerneldeck --help`: the modes, then the dashboard's own flags.
func writeUsage(w io.Writer, all []mode) {
	fmt.Fprint(w, "kerneldeck: a terminal dashboard and embedded engine for persistent Python\nsession kernels on local and remote hosts.\n\nUsage:\n")
	var helps []string
	for _, m := range all {
		cmd := "kerneldeck [flags]"
		if m.name != "" {
			cmd = "kerneldeck " + m.name + " [flags]"
			helps = append(helps, "help "+m.name)
		}
		writeWrappedAt(w, "  "+cmd, m.summary, usageDescAt)
	}
	writeWrappedAt(w, "  kerneldeck version", "print the version", usageDescAt)
	writeWrappedAt(w, "  kerneldeck help [command]", "show this help, or every flag of a command (help dashboard, "+
		strings.Join(helps, ", ")+")", usageDescAt)
	fmt.Fprintln(w)
	d := newDashboardCmd()
	fs := newFlagSet("kerneldeck")
	d.registerOwn(fs)
	fs.writeHelp(w)
	fmt.Fprint(w, "\nThe engine flags every mode shares (--backend, --max-kernels, --idle-exit,\n--keep-kernels, --config, the host tool and ssh flags) are listed by\n'kerneldeck help dashboard' and 'kerneldeck help headless', which also\ndescribes the JSON-lines contract.\n")
}

// reporters returns a mode's two ways to end with an error: usage (the
// command line must be fixed; exit 2, with a pointer to --help) and fail
// (something went wrong; exit 1).
func reporters(stderr io.Writer, prog string) (usage, fail func(error) int) {
	usage = func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for the flags.\n", prog, err, prog)
		return exitUsage
	}
	fail = func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitFail
	}
	return usage, fail
}

// parseMode parses a mode's arguments. help is true when --help was asked
// for and printed.
func parseMode(fs *flagSet, args []string, std stdio, help func(io.Writer)) (set map[string]bool, done bool, err error) {
	set, err = fs.parse(args)
	if errors.Is(err, flag.ErrHelp) {
		help(std.out)
		return nil, true, nil
	}
	return set, false, err
}

// isHelpOrVersion tells the top-level help and version flags from the
// dashboard's flags.
func isHelpOrVersion(arg string) bool {
	switch arg {
	case "--version", "-version", "--help", "-help", "-h":
		return true
	}
	return false
}

func versionString() string {
	version, rev := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("kerneldeck %s%s %s", version, rev, runtime.Version())
}
