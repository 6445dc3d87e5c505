package backends

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/moby/moby/client"
)

// LoseCreateAnswers makes b's pod creates reach the API and their answers
// be lost, as when the engine gives a create up the moment it was sent (it
// closes): the pod is made, and the caller sees an error.
func LoseCreateAnswers(b *PodSandbox) error {
	b.cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return lostAnswers{rt, "/pods"}
	}
	core, params, err := coreClient(b.cfg)
	if err != nil {
		return err
	}
	b.core, b.params = core, params
	return nil
}

// LoseContainerCreateAnswers is LoseCreateAnswers for b's containers, on
// the Docker Engine at /var/run/docker.sock.
func LoseContainerCreateAnswers(b *ImageSandbox) error {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", "/var/run/docker.sock")
	}}
	cli, err := client.New(client.FromEnv, client.WithAPIVersionNegotiation(), client.WithHTTPClient(&http.Client{Transport: lostAnswers{tr, "/containers/create"}}))
	if err != nil {
		return err
	}
	b.cli = cli
	return nil
}

// lostAnswers sends every request, and loses the answer of a POST whose
// path ends in create.
type lostAnswers struct {
	rt     http.RoundTripper
	create string
}

func (l lostAnswers) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := l.rt.RoundTrip(r)
	if err == nil && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, l.create) {
		res.Body.Close()
		return nil, errors.New("the answer was lost")
	}
	return res, err
}
