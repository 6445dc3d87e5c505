package cli

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/config"
	"github.com/kerneldeck/kerneldeck/engine"
)

// connectTarget describes --connect and --attach, which take the same value.
const connectTarget = "the engine at `TARGET`: a socket path, ssh://[user@]host[:port][/PATH] (host may be a Host alias " +
	"from ~/.ssh/config; PATH defaults to that user's default), or nothing for this machine's default " +
	"($XDG_RUNTIME_DIR/kerneldeck/engine.sock, else <state dir>/engine.sock)"

// connectFlagsOK are the engine flags that still mean something when the
// engine is elsewhere: how to reach it.
var connectFlagsOK = []string{"ssh-config", "identity", "known-hosts", "accept-new-host-key", "state-dir"}

// checkConnectFlags refuses engine flags given with --connect or --attach:
// the engine they would configure is not this process's.
func checkConnectFlags(f *engineFlags, flag string, own ...string) error {
	var bad []string
	for name := range f.set {
		if name != flag && !slices.Contains(connectFlagsOK, name) && !slices.Contains(own, name) {
			bad = append(bad, "--"+name)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("%s cannot be used with --%s: the engine you connect to has its own settings (only %s apply, to reach it)",
		strings.Join(bad, ", "), flag, "--"+strings.Join(connectFlagsOK, ", --"))
}

// redialEngine connects to the engine at target for a client that dials it
// again when it goes away (client.Redialer), saying so with say.
func redialEngine(ctx context.Context, f *engineFlags, target string, o client.Options, say func(string)) (*client.Redialer, error) {
	first, err := dialEngine(ctx, f, target, o)
	if err != nil {
		return nil, err
	}
	return client.NewRedialer(first, func(ctx context.Context) (*client.Client, error) {
		return dialEngine(ctx, f, target, o)
	}, say), nil
}

// clientPlace is where this process works, for the engine at target to
// run the kernels it makes for us there (engine.PlaceHere); zero for an
// engine over ssh, on another filesystem, where its backends' defaults
// apply.
func clientPlace(target, python string) engine.Place {
	if strings.HasPrefix(target, "ssh://") {
		return engine.Place{}
	}
	return engine.PlaceHere(python)
}

// dialEngine connects to the engine at target for a client, within 30 s
// and while ctx lasts.
func dialEngine(ctx context.Context, f *engineFlags, target string, o client.Options) (*client.Client, error) {
	stateDir := f.stateDir
	if stateDir == "" {
		var err error
		if stateDir, err = config.DefaultStateDir(); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, target, client.DialOptions{StateDir: stateDir, SSH: f.ssh})
	if err != nil {
		return nil, err
	}
	if o.Place.IsZero() {
		python, _ := f.values["python"].(string)
		o.Place = clientPlace(target, python)
	}
	c, err := client.New(ctx, conn, conn.Where, o)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}
