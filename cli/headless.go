package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/headless"
	"github.com/kerneldeck/kerneldeck/internal/english"
)

const headlessIntro = `Usage: kerneldeck headless [flags]

Serves the kernel engine on stdin/stdout: one JSON request per input line, one
JSON response per output line. Requests run concurrently; every response
echoes its request's "id" (a string) and has an "op". Cells for one kernel
run in the order their lines arrived. At EOF it finishes the running
requests, kills every kernel on its host (unless --keep-kernels) and exits 0;
SIGINT and SIGTERM also kill every kernel before exiting. With --connect it
runs no engine of its own: the lines go to a shared one ('kerneldeck serve',
or a dashboard's), and the end of input ends only this connection.

`

const headlessEpilogue = `
Approvals: without --approve (and without approve = "all"|"ask"|"none" in the
config, which works like it), read_file, list_files and http_get run, and
write_file, terminal and any other tool ask. [approvals] in the config changes
this per tool (terminal = "deny") and per owner ([approvals.owners.NAME],
where "*" is every tool); the policies are allow, ask and deny. A call that
asks writes an event line, even without --events:
  {"op":"event","type":"approval_request","request":"REQUEST-ID","kernel":...,
   "owner":...,"tool":"terminal","args":{...},"time":...,"detail":...}
and waits until an approve request answers it (see below) or the approval
timeout ends, which denies it. An approval_decided event with the same
"request" tells how it ended. After end of input nothing can answer, so
pending calls are denied when their timeout ends.

Requests (timeouts and idle_exit are in seconds):
  {"id":"1","op":"execute","code":"x = 1","owner":"me","task":"t","backend":"local",
   "child":"","tools":[],"timeout":30,"reset":false}     only id, op, code are required;
                                                        owner defaults to task, task to "default"
  {"id":"2","op":"kernels"}
  {"id":"3","op":"limits","max_kernels":2,"idle_exit":600}
  {"id":"4","op":"interrupt","kernel":"KERNEL-ID"}
  {"id":"5","op":"kill","kernel":"KERNEL-ID"}
  {"id":"6","op":"shutdown_owner","owner":"me"}
  {"id":"7","op":"shutdown_all"}
  {"id":"8","op":"approve","request":"REQUEST-ID","decision":"once"}
      answers an approval_request at once, even while cells run: once runs
      this call, always runs every call of this tool by this owner until
      kerneldeck exits, deny refuses it. Answered with {"id":"8","op":"ok"},
      or an error if the request is unknown (already answered, timed out or
      its cell ended)
  {"id":"9","op":"hello"}                   the engine's version, protocol (2),
      backends, limits, and who you are to it
  {"id":"10","op":"subscribe","since":3600,"output":true}
      every event from now on, the last hour's first (marked "history":true),
      and with output the output of every cell as cell_output events
  {"id":"11","op":"cells","kernel":"KERNEL-ID"}
      the kernel's recent cells, whoever ran them: code, status, duration,
      the head and tail of the output
  {"id":"12","op":"complete","kernel":"KERNEL-ID","code":"os.pa","cursor":5}
      what the kernel's namespace offers at the cursor (characters), without
      running a cell: {"id","op":"completions","start":3,"matches":["path",...]}
  {"id":"13","op":"input_reply","to":"1","value":"Ada"}
      answers the {"id":"1","op":"input_request","cell","prompt","password"}
      line an execute with "input":true gets when its cell calls input() or
      getpass(); "eof":true ends input (EOFError). Without "input":true,
      input() raises EOFError at once
  {"id":"14","op":"park","kernel":"KERNEL-ID"}
      parks an idle kernel now (as an eviction would): its namespace is
      saved, the kernel goes, and its key's next execute restores it
      ("state_restored", the note naming what did not come back)
  {"id":"15","op":"drop_parked","owner":"me","task":"t"}
      discards a parked state ("dropped":true if there was one); the
      kernels answer lists them under "parked"
  "stream":true on an execute sends {"id","op":"started","cell"} and
  {"id","op":"output","stream","text"} lines while the cell runs.
A bad request (not JSON, a field given twice, a field its op does not have,
an id that is not a string) is answered with
{"id":...,"op":"error","error":"..."} and serving goes on.

Example:
  echo '{"id":"1","op":"execute","code":"print(1)"}' | kerneldeck headless
`

// headlessCmd is `kerneldeck headless`: the engine as JSON lines.
type headlessCmd struct {
	eng         engineFlags
	events      bool
	connect     string
	noReconnect bool
}

func (c *headlessCmd) flags() *flagSet {
	fs := newFlagSet("kerneldeck headless")
	fs.section("Headless flags:")
	fs.Bool(&c.events, "events", `interleave lifecycle events as lines like {"op":"event", "type":"spawned", "time":..., `+
		`"kernel":..., "owner":..., "detail":...}`)
	fs.Optional(&c.connect, "connect", "instead of running an engine, bridge stdin and stdout to "+connectTarget+
		"; the requests and answers are the same, and ending the input ends this connection only (no kernel is killed)")
	fs.Bool(&c.noReconnect, "no-reconnect", "with --connect, end when the engine goes away instead of dialing it again "+
		"(for up to "+english.Count(int(client.RedialFor/time.Minute), "minute")+", sending again what it had not answered; an execute's \"cell\" id keeps it from running twice); "+
		"on this machine the engine then reads and writes this process's stdin and stdout itself, a relay hop less per request")
	c.eng.register(fs)
	return fs
}

func headlessMode() mode {
	return newMode("headless", "serve the engine as JSON lines on stdin/stdout", headlessIntro, headlessEpilogue, func() command { return &headlessCmd{} })
}

func (c *headlessCmd) run(args []string, std stdio, help func(io.Writer)) int {
	r, code, ok := startMode("kerneldeck headless", c.flags(), &c.eng, args, std, help)
	if !ok {
		return code
	}
	if connects, err := r.connects("connect", "events", "no-reconnect"); err != nil {
		return r.usage(err)
	} else if connects {
		return c.bridge(std)
	} else if c.noReconnect {
		return r.usage(errors.New("--no-reconnect goes with --connect: without it, this process runs the engine"))
	}
	eng, code, ok := r.ownEngine(context.Background())
	if !ok {
		return code
	}

	// A reader that goes away must not kill us with SIGPIPE before the
	// kernels are killed: the write fails instead and Serve returns.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	serveErr := headless.Serve(ctx, eng.Engine, std.in, std.out, headless.Options{Events: c.events, Version: versionString()})
	signaled := ctx.Err() != nil
	// A second signal now ends the process at once, as an impatient
	// operator expects.
	stop()

	_, closeErr := eng.close()
	return r.finish(signaled, serveErr, closeErr, "; the kernels keep running (--keep-kernels)", "every kernel was killed",
		"shut down kernels")
}
