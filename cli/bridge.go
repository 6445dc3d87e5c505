package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/config"
)

// eventsSubscription is the id of the subscribe request --events sends for
// the agent; its answer is not passed on.
const eventsSubscription = "kerneldeck:events"

// bridge is `headless --connect`: stdin to the engine, the engine to
// stdout, line for line. The end of stdin ends the connection once the
// running requests are answered; the engine saying goodbye is a failure.
func (c *headlessCmd) bridge(std stdio) int {
	const prog = "kerneldeck headless"
	_, fail := reporters(std.err, prog)
	stateDir := c.eng.stateDir
	if stateDir == "" {
		var err error
		if stateDir, err = config.DefaultStateDir(); err != nil {
			return fail(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	conn, err := client.Dial(ctx, c.connect, client.DialOptions{StateDir: stateDir, SSH: c.eng.ssh})
	cancel()
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	signal.Ignore(syscall.SIGPIPE)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	if uc, ok := conn.Conn.(*net.UnixConn); ok && c.noReconnect {
		if in, out, ok := pollablePipes(std); ok {
			return c.handOver(std, conn.Where, uc, in, out, sigs)
		}
	}
	if c.noReconnect {
		return c.relayOnce(std, conn, sigs)
	}
	r := &relay{prog: prog, std: std, where: conn.Where, events: c.events, dial: func(ctx context.Context) (*client.Conn, error) {
		return client.Dial(ctx, c.connect, client.DialOptions{StateDir: stateDir, SSH: c.eng.ssh})
	}}
	r.place = placeFields(clientPlace(c.connect, ""))
	return r.run(conn, sigs)
}

// relayOnce relays the lines of one connection (--no-reconnect where the
// engine cannot take the pipes over): its end is the end.
func (c *headlessCmd) relayOnce(std stdio, conn *client.Conn, sigs <-chan os.Signal) int {
	const prog = "kerneldeck headless"
	_, fail := reporters(std.err, prog)
	if err := openConnection(conn, c.events); err != nil {
		return fail(err)
	}
	inDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, std.in)
		endWrites(conn)
		inDone <- err
	}()
	outDone := make(chan error, 1)
	var goodbye string
	go func() { outDone <- copyAnswers(std.out, conn, c.events, &goodbye) }()

	select {
	case <-sigs:
		fmt.Fprintf(std.err, "%s: stopped by a signal; the kernels stay on the engine at %s\n", prog, conn.Where)
		return exitOK
	case err := <-outDone:
		inputOver := false
		select {
		case inErr := <-inDone:
			inputOver = inErr == nil
		default:
		}
		switch {
		case goodbye != "":
			return fail(fmt.Errorf("the engine at %s said goodbye: %s", conn.Where, goodbye))
		case err != nil:
			return fail(fmt.Errorf("the connection to %s: %w", conn.Where, err))
		case !inputOver:
			return fail(fmt.Errorf("the engine at %s closed the connection", conn.Where))
		}
		return exitOK
	}
}

// copyAnswers copies the engine's lines to out until the connection ends,
// holding back the answer to --events' own subscription and noting a
// goodbye.
func copyAnswers(out io.Writer, conn io.Reader, subscribed bool, goodbye *string) error {
	br := bufio.NewReaderSize(conn, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		first := true
		for errors.Is(err, bufio.ErrBufferFull) {
			// A long line (a big result): pass it on in pieces.
			if _, werr := out.Write(line); werr != nil {
				return werr
			}
			first = false
			line, err = br.ReadSlice('\n')
		}
		if first && len(line) > 0 {
			switch {
			case subscribed && bytes.HasPrefix(line, []byte(`{"id":"`+eventsSubscription+`",`)):
				subscribed = false
				continue
			case bytes.HasPrefix(line, []byte(`{"op":"goodbye"`)):
				var g struct{ Reason string }
				json.Unmarshal(line, &g)
				*goodbye = g.Reason
			}
		}
		if len(line) > 0 {
			if _, werr := out.Write(line); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// pollablePipes returns the descriptors of stdin and stdout when both are
// pipes or sockets, which the engine can take over; a terminal or a file
// is relayed instead (making it non-blocking would change it for others).
func pollablePipes(std stdio) (in, out int, ok bool) {
	fd := func(x any) (int, bool) {
		f, isFile := x.(*os.File)
		if !isFile {
			return 0, false
		}
		raw, err := f.SyscallConn()
		if err != nil {
			return 0, false
		}
		n := -1
		raw.Control(func(p uintptr) { n = int(p) })
		var st syscall.Stat_t
		if n < 0 || syscall.Fstat(n, &st) != nil {
			return 0, false
		}
		mode := st.Mode & syscall.S_IFMT
		return n, mode == syscall.S_IFIFO || mode == syscall.S_IFSOCK
	}
	in, inOK := fd(std.in)
	out, outOK := fd(std.out)
	return in, out, inOK && outOK
}

// handOver gives the engine this process's stdin and stdout, then waits
// for it to say the connection ended.
func (c *headlessCmd) handOver(std stdio, where string, uc *net.UnixConn, in, out int, sigs <-chan os.Signal) int {
	const prog = "kerneldeck headless"
	_, fail := reporters(std.err, prog)
	// The engine polls them; only this process shares these ends.
	syscall.SetNonblock(in, true)
	syscall.SetNonblock(out, true)
	hello := fmt.Sprintf(`{"op":"stdio","events":%v}`+"\n", c.events)
	if _, _, err := uc.WriteMsgUnix([]byte(hello), syscall.UnixRights(in, out), nil); err != nil {
		return fail(fmt.Errorf("hand stdin and stdout to the engine at %s: %w", where, err))
	}
	ended := make(chan string, 1)
	go func() {
		br := bufio.NewReader(uc)
		for {
			line, err := br.ReadBytes('\n')
			var m struct{ Op, Goodbye string }
			if json.Unmarshal(line, &m) == nil && m.Op == "ended" {
				ended <- m.Goodbye
				return
			}
			if err != nil {
				close(ended)
				return
			}
		}
	}()
	select {
	case <-sigs:
		fmt.Fprintf(std.err, "%s: stopped by a signal; the kernels stay on the engine at %s\n", prog, where)
		return exitOK
	case goodbye, ok := <-ended:
		switch {
		case !ok:
			return fail(fmt.Errorf("the engine at %s closed the connection", where))
		case goodbye != "":
			return fail(fmt.Errorf("the engine at %s said goodbye: %s", where, goodbye))
		}
		return exitOK
	}
}
