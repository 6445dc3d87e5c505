package headless

import (
	"context"
	"fmt"
	"sync"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/wire"
)

// inputs holds the input() calls of this connection's cells that wait for
// an input_reply, by the id of the execute that ran them.
type inputs struct {
	mu      sync.Mutex
	waiting map[string]chan inputAnswer
}

type inputAnswer struct {
	value string
	eof   bool
}

// asker returns the OnInput of the execute with id: it writes an
// input_request line and waits for the input_reply that names id.
func (s *server) asker(id string) func(context.Context, engine.InputRequest) (string, error) {
	return func(ctx context.Context, ask engine.InputRequest) (string, error) {
		ch := make(chan inputAnswer, 1)
		in := &s.inputs
		in.mu.Lock()
		if _, busy := in.waiting[id]; busy {
			in.mu.Unlock()
			return "", fmt.Errorf("another input() waits on execute %q; give each execute its own id", id)
		}
		if in.waiting == nil {
			in.waiting = map[string]chan inputAnswer{}
		}
		in.waiting[id] = ch
		in.mu.Unlock()
		defer func() {
			in.mu.Lock()
			delete(in.waiting, id)
			in.mu.Unlock()
		}()
		s.w.write(wire.InputRequest{Head: wire.Head{ID: id, Op: wire.OpInputRequest}, Cell: ask.Cell, Prompt: ask.Prompt, Password: ask.Password})
		select {
		case a := <-ch:
			if a.eof {
				return "", engine.ErrInputEOF
			}
			return a.value, nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// reply gives an input_reply to the input() it names.
func (s *server) reply(r *request) {
	in := &s.inputs
	in.mu.Lock()
	ch, ok := in.waiting[r.to]
	if ok {
		delete(in.waiting, r.to)
	}
	in.mu.Unlock()
	if !ok {
		s.w.writeError(&r.id, fmt.Sprintf("no input() waits on execute %q on this connection: answer an input_request with its id as \"to\"", r.to))
		return
	}
	ch <- inputAnswer{value: r.value, eof: r.eof}
	s.w.write(wire.OK{Head: wire.Head{ID: r.id, Op: wire.OpOK}})
}
