package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/mcpserver"
)

const mcpIntro = `Usage: kerneldeck mcp [flags]

Serves persistent Python kernels to an agent host as a Model Context
Protocol server. Tools:
  python_exec(code, session?, timeout_s?, reset?)   run a cell in your kernel
      for session (default "default"); state persists between calls
  python_sessions()                                 your kernels and timers
  python_interrupt(session?), python_reset(session?), python_close(session?)

On stdin/stdout by default: the host starts 'kerneldeck mcp' itself. With
--http it serves streamable HTTP on a loopback port or a Unix socket instead,
to clients that send the bearer token kept in --token-file.

The kernels belong to --owner, else to the client's name from the MCP
handshake, else to your login; a client never reaches another owner's
kernels, whatever session it names. By default the engine is this process's
own (the engine flags below apply, and the kernels die with it); with
--connect it is a running 'kerneldeck serve', so the operator's dashboard
shows the agent's kernels. Tool calls that need approval are put to the
client by elicitation when it supports it, else to that engine's dashboard.

`

const mcpEpilogue = `
A host's config entry:
  {"mcpServers": {"kerneldeck": {"command": "kerneldeck", "args": ["mcp"]}}}

Examples:
  kerneldeck mcp --connect
  kerneldeck mcp --backend ssh://gpu-box --owner agent-7
  kerneldeck mcp --http 127.0.0.1:8765 --token-file ~/.config/kerneldeck/mcp.token
`

// mcpCmd is `kerneldeck mcp`.
type mcpCmd struct {
	eng       engineFlags
	owner     string
	tools     []string
	httpAddr  string
	tokenFile string
	connect   string
}

func (c *mcpCmd) flags() *flagSet {
	fs := newFlagSet("kerneldeck mcp")
	fs.section("MCP flags:")
	fs.Func("owner", "the `OWNER` of every kernel this server starts (default: the client's name, else your login)", nonEmpty("owner", &c.owner))
	fs.Func("tools", "host tools the kernels may call, comma-separated `LIST` (read_file, list_files, write_file, http_get, "+
		"terminal); each call is still subject to the approval policy (default none)", func(v string) error {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				c.tools = append(c.tools, t)
			}
		}
		return nil
	})
	fs.Func("http", "serve streamable HTTP at `ADDR` instead of stdio: 127.0.0.1:PORT, [::1]:PORT, localhost:PORT or "+
		"unix:PATH; needs --token-file; other addresses are refused", nonEmpty("http", &c.httpAddr))
	fs.Path(&c.tokenFile, "token-file", "the `FILE` holding the bearer token HTTP clients must send (yours, mode 0600, "+
		"one line of at least 16 characters, e.g. from openssl rand -hex 32)")
	fs.Optional(&c.connect, "connect", "use "+connectTarget+" instead of an engine of its own")
	c.eng.register(fs)
	return fs
}

func mcpMode() mode {
	return newMode("mcp", "serve kernels to agents as an MCP server (stdio or HTTP)", mcpIntro, mcpEpilogue, func() command { return &mcpCmd{} })
}

func (c *mcpCmd) run(args []string, std stdio, help func(io.Writer)) int {
	r, code, ok := startMode("kerneldeck mcp", c.flags(), &c.eng, args, std, help)
	if !ok {
		return code
	}
	set := r.set
	var err error
	if set["http"] != set["token-file"] {
		err = errors.New("--http and --token-file go together: HTTP clients must present the token in the file")
	}
	if err == nil && set["http"] {
		err = mcpserver.CheckHTTPAddr(c.httpAddr)
	}
	if err == nil && len(c.eng.backends) > 1 {
		err = fmt.Errorf("--backend is given %d times; the MCP server starts its kernels on one backend", len(c.eng.backends))
	}
	if err == nil {
		if _, kerr := engine.NewKey("o", "local", "default", "", c.tools); kerr != nil {
			err = fmt.Errorf("--tools: %w", kerr)
		}
	}
	var connects bool
	if err == nil {
		connects, err = r.connects("connect", "owner", "tools", "http", "token-file", "backend")
	}
	if err != nil {
		return r.usage(err)
	}
	token := ""
	if set["token-file"] {
		if token, err = mcpserver.ReadToken(c.tokenFile); err != nil {
			return r.usage(err)
		}
	}
	opts := mcpserver.Options{Owner: c.owner, Login: loginName(), Tools: c.tools, Version: versionString()}
	if len(c.eng.backends) == 1 {
		opts.Backend = c.eng.backends[0]
	}

	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var eng mcpserver.Engine
	var closeEng func() error
	if connects {
		cl, err := redialEngine(context.Background(), &c.eng, c.connect, client.Options{}, func(s string) {
			fmt.Fprintf(std.err, "kerneldeck mcp: %s\n", s)
		})
		if err != nil {
			return r.fail(err)
		}
		eng, opts.Events, closeEng = cl, cl.Events(), cl.Close
	} else {
		le, code, ok := r.ownEngine(ctx)
		if !ok {
			return code
		}
		sub := le.SubscribeWith(engine.SubscribeOptions{Buffer: 1024})
		eng, opts.Events = le.Engine, sub.C
		closeEng = func() error {
			sub.Close()
			_, err := le.close()
			return err
		}
	}
	srv := mcpserver.New(eng, opts)
	var serveErr error
	if set["http"] {
		serveErr = c.serveHTTP(ctx, srv, token, std)
	} else {
		serveErr = srv.MCP().Run(ctx, mcpserver.StdioTransport(os.Stdin, os.Stdout))
	}
	srv.Close()
	closeErr := closeEng()
	if serveErr != nil && ctx.Err() == nil && !errors.Is(serveErr, io.EOF) && !errors.Is(serveErr, mcp.ErrConnectionClosed) {
		return r.fail(errors.Join(serveErr, closeErr))
	}
	if closeErr != nil {
		return r.fail(closeErr)
	}
	return exitOK
}

// serveHTTP serves srv at --http until ctx ends.
func (c *mcpCmd) serveHTTP(ctx context.Context, srv *mcpserver.Server, token string, std stdio) error {
	l, where, err := mcpserver.ListenHTTP(c.httpAddr)
	if err != nil {
		return err
	}
	if path, ok := strings.CutPrefix(where, "unix:"); ok {
		defer os.Remove(path)
	}
	fmt.Fprintf(std.err, "kerneldeck mcp: streamable HTTP at %s (bearer token from %s)\n", where, c.tokenFile)
	hs := &http.Server{Handler: srv.Handler(token), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
	}()
	if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// loginName is this user's login, the owner of a client that names none.
func loginName() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return defaultOwner()
}
