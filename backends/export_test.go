package backends

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/moby/moby/client"
)

// LosingCreateAnswers is opts with which a k8s-image backend's pod
// creates reach the API and their answers are lost, as when the engine
// gives a create up the moment it was sent (it closes): the pod is made,
// and the caller sees an error.
func LosingCreateAnswers(opts Options) Options {
	opts.k8sTransport = func(rt http.RoundTripper) http.RoundTripper { return lostAnswers{rt, "/pods"} }
	return opts
}

// LoseContainerCreateAnswers makes b's container creates reach the Docker
// Engine at /var/run/docker.sock and their answers be lost, as
// LosingCreateAnswers does for pods (b starts nothing that uses its client
// in the background, so it is swapped after the open).
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
