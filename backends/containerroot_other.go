//go:build !linux

package backends

import (
	"context"
	"errors"
	"net"
)

// containerRoot needs Linux's /proc; elsewhere the relay is the only path.
type containerRoot struct{}

func openContainerRoot(int, string) (*containerRoot, error) { return nil, errors.ErrUnsupported }

func (*containerRoot) DialUnix(context.Context, string) (net.Conn, error) {
	return nil, errors.ErrUnsupported
}

func (*containerRoot) Close() error { return nil }
