package backends

import "context"

// ExecuteOnly hides env's fast paths, so that every operation goes through
// plain Execute (for hosts that forbid socket forwarding, and for tests that
// prove the portable path). A backend that makes a host per kernel stays
// one, and the hosts it makes are execute-only too.
func ExecuteOnly(env Env) Env {
	if p, ok := env.(Provisioner); ok {
		return executeOnlyProvisioner{executeOnly{inner: env}, p}
	}
	return executeOnly{inner: env}
}

// executeOnly deliberately does not implement Wrapper: StreamsOf stops here.
type executeOnly struct{ inner Env }

func (e executeOnly) Execute(ctx context.Context, command string, opts ExecOptions) (Result, error) {
	return e.inner.Execute(ctx, command, opts)
}
func (e executeOnly) TempDir() string { return e.inner.TempDir() }
func (e executeOnly) URI() string     { return e.inner.URI() }

// executeOnlyProvisioner makes execute-only hosts, which keep what the
// engine asks of a host of its own (disposal, a death's cause, a place).
type executeOnlyProvisioner struct {
	executeOnly
	p Provisioner
}

func (e executeOnlyProvisioner) Provision(ctx context.Context, key string) (Env, error) {
	host, err := e.p.Provision(ctx, key)
	if err != nil {
		return nil, err
	}
	return executeOnlyHost{executeOnly{inner: host}}, nil
}

type executeOnlyHost struct{ executeOnly }

func (e executeOnlyHost) Dispose(ctx context.Context) error {
	if d, ok := Find[Disposer](e.inner); ok {
		return d.Dispose(ctx)
	}
	return nil
}

func (e executeOnlyHost) DeathCause(ctx context.Context) string {
	if d, ok := Find[DeathExplainer](e.inner); ok {
		return d.DeathCause(ctx)
	}
	return ""
}

func (e executeOnlyHost) Place() Place {
	if p, ok := Find[Placement](e.inner); ok {
		return p.Place()
	}
	return Place{}
}
