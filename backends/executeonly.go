package backends

import "context"

// ExecuteOnly hides env's fast paths, so that every operation goes through
// plain Execute (for hosts that forbid socket forwarding, and for tests that
// prove the portable path).
func ExecuteOnly(env Env) Env { return executeOnly{inner: env} }

// executeOnly deliberately does not implement Wrapper: StreamsOf stops here.
type executeOnly struct{ inner Env }

func (e executeOnly) Execute(ctx context.Context, command string, opts ExecOptions) (Result, error) {
	return e.inner.Execute(ctx, command, opts)
}
func (e executeOnly) TempDir() string { return e.inner.TempDir() }
func (e executeOnly) URI() string     { return e.inner.URI() }
