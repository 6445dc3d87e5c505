package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/config"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/eventlog"
	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

const eventsIntro = `Usage: kerneldeck events [flags]

Reads the event log an engine keeps in <state dir>/events/: every spawn, cell,
reap, eviction, kill, tool call and refusal, with its reason, so you can answer
"why was alice's kernel evicted at 03:12?" the next morning. Oldest first.

`

const eventsEpilogue = `
Times: a Go duration counts back from now (--since 1h, --since 90m); a time
is RFC 3339 (2026-12-01T03:00:00Z), or "2006-01-02 15:04[:05]", or a date,
or a clock time today ("03:12"), in local time unless it says otherwise.

Examples:
  kerneldeck events --since 12h --owner alice --type evicted_cap,reaped_idle
  kerneldeck events --kernel k1234abcd --json
  kerneldeck events --follow
`

// eventsCmd is `kerneldeck events`: the event log, filtered.
type eventsCmd struct {
	stateDir     string
	since, until string
	filter       eventlog.Filter
	follow, json bool
}

func (c *eventsCmd) flags() *flagSet {
	fs := newFlagSet("kerneldeck events")
	fs.section("Flags:")
	fs.Func("since", "only events from `TIME` on: a duration back from now (1h) or a time (default: all kept)", func(s string) error {
		c.since = s
		return nil
	})
	fs.Func("until", "only events up to `TIME`", func(s string) error { c.until = s; return nil })
	fs.Func("owner", "only the events of owner `O`", func(s string) error { c.filter.Owner = s; return nil })
	fs.Func("kernel", "only the events of kernel `ID`", func(s string) error { c.filter.Kernel = s; return nil })
	fs.Func("type", "only events of these `TYPES`, comma-separated (e.g. evicted_cap,reaped_idle)", func(s string) error {
		for t := range strings.SplitSeq(s, ",") {
			t = strings.TrimSpace(t)
			if !slices.Contains(engine.EventTypes(), engine.EventType(t)) {
				var names []string
				for _, k := range engine.EventTypes() {
					names = append(names, string(k))
				}
				return fmt.Errorf("%q is not an event type; the types are %s", t, strings.Join(names, ", "))
			}
			c.filter.Types = append(c.filter.Types, engine.EventType(t))
		}
		return nil
	})
	fs.Bool(&c.follow, "follow", "after the events kept, go on printing new ones as engines append them, until ctrl+c")
	fs.Bool(&c.json, "json", "print each event as a JSON line, as the log keeps it")
	fs.Path(&c.stateDir, "state-dir", "the engine's state `DIR` (default $XDG_STATE_HOME/kerneldeck, or ~/.local/state/kerneldeck)")
	return fs
}

func eventsMode() mode {
	return newMode("events", "read the event log: why each kernel was reaped or evicted", eventsIntro, eventsEpilogue, func() command { return &eventsCmd{} })
}

// parseWhen reads a --since or --until value against now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q: a duration counts back from now and must not be negative", s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02T15:04:05", "2006-01-02T15:04", time.DateOnly} {
		if t, err := time.ParseInLocation(layout, s, now.Location()); err == nil {
			return t, nil
		}
	}
	for _, layout := range []string{"15:04:05", "15:04"} {
		if t, err := time.ParseInLocation(layout, s, now.Location()); err == nil {
			y, m, d := now.Date()
			return time.Date(y, m, d, t.Hour(), t.Minute(), t.Second(), 0, now.Location()), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is neither a duration (1h, 90m) nor a time (2026-12-01T03:00:00Z, \"2026-12-01 03:00\", 03:12)", s)
}

func (c *eventsCmd) run(args []string, std stdio, help func(io.Writer)) int {
	const prog = "kerneldeck events"
	usageErr, fail := reporters(std.err, prog)
	_, done, err := parseMode(c.flags(), args, std, help)
	if done {
		return exitOK
	}
	if err != nil {
		return usageErr(err)
	}
	now := time.Now()
	if c.since != "" {
		if c.filter.Since, err = parseWhen(c.since, now); err != nil {
			return usageErr(fmt.Errorf("--since: %w", err))
		}
	}
	if c.until != "" {
		if c.filter.Until, err = parseWhen(c.until, now); err != nil {
			return usageErr(fmt.Errorf("--until: %w", err))
		}
		if c.follow {
			return usageErr(errors.New("--follow waits for new events, which are all after --until; give one of them"))
		}
	}
	if c.stateDir == "" {
		if c.stateDir, err = config.DefaultStateDir(); err != nil {
			return fail(err)
		}
	}
	dir := filepath.Join(c.stateDir, "events")
	if _, err := os.Stat(dir); err != nil && !c.follow {
		return fail(fmt.Errorf("no event log in %s (%v): an engine with this state dir has not run yet; see --state-dir", dir, err))
	}
	r := eventlog.NewReader(dir)
	printed := 0
	print := func(ev engine.Event) error {
		printed++
		if c.json {
			line, _ := json.Marshal(ev)
			_, err := fmt.Fprintf(std.out, "%s\n", line)
			return err
		}
		_, err := fmt.Fprintln(std.out, humanEvent(ev))
		return err
	}
	if err := r.Read(c.filter, print); err != nil {
		return fail(err)
	}
	if printed == 0 && !c.follow {
		// Silence would read as a broken log or a wrong dir.
		fmt.Fprintf(std.err, "%s: no event in %s matches (see --help for the filters)\n", prog, dir)
	}
	if c.follow {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
	follow:
		for {
			select {
			case <-ctx.Done():
				break follow
			case <-tick.C:
				if err := r.Read(c.filter, print); err != nil {
					return fail(err)
				}
			}
		}
	}
	if r.Bad > 0 {
		fmt.Fprintf(std.err, "%s: skipped %d lines of %s that are not events\n", prog, r.Bad, dir)
	}
	return exitOK
}

// humanEvent is one event as one line for a terminal: what a kernel printed
// or chose as a name is shown, never obeyed, and cannot start a line.
func humanEvent(ev engine.Event) string {
	who := termtext.Line(ev.Owner)
	what := termtext.Line(ev.Detail)
	if k := termtext.Line(ev.Kernel); k != "" && what != "" {
		what = k + ": " + what
	} else if k != "" {
		what = k
	}
	return fmt.Sprintf("%s  %-18s %-12s %s", ev.Time.Local().Format("2006-01-02 15:04:05"), ev.Type, who, what)
}
