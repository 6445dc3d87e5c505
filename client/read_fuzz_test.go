package client

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/wire"
)

// fuzzConn is an engine's side that sends fixed bytes and then ends.
type fuzzConn struct{ r io.Reader }

func (c fuzzConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c fuzzConn) Write(p []byte) (int, error) { return len(p), nil }
func (c fuzzConn) Close() error                { return nil }

// What an engine sends is read by the client's reader: arbitrary bytes
// never panic it; the pending call gets exactly one answer or is failed;
// every event passed on decodes; the client ends when the bytes do.
func FuzzClientLines(f *testing.F) {
	for _, s := range []string{
		`{"id":"c1","op":"result","status":"success","stdout":"1\n"}` + "\n",
		`{"op":"event","type":"spawned","time":"2030-01-01T00:00:00Z","kernel":"k"}` + "\n" + `{"id":"c1","op":"ok"}` + "\n",
		`{"id":"c1","op":"started","cell":"c9"}` + "\n" + `{"id":"c1","op":"output","stream":"stdout","text":"x"}` + "\n",
		`{"op":"goodbye","reason":"bye"}` + "\n",
		`{"id":5,"op":"error","error":"x"}` + "\n", "not json\n", `{"op":"event","type":5}` + "\n",
		`{"id":"c1","op":"error","error":"boom"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &Client{conn: fuzzConn{bytes.NewReader(data)}, where: "fuzz", pending: map[string]*pendingCall{}, refresh: make(chan struct{}, 1),
			limitsQ: make(chan *wire.Limits, 1), events: make(chan engine.Event, 1024), done: make(chan struct{})}
		answers := 0
		p := &pendingCall{answer: make(chan []byte, 1), lines: func(wire.Op, []byte) {}}
		c.pending["c1"] = p
		c.read()
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			t.Fatal("the client did not end with its input")
		}
		for range p.answer {
			answers++
			if answers > 1 {
				t.Fatal("two answers to one call")
			}
			break
		}
		for ev := range c.events {
			if _, err := json.Marshal(ev); err != nil {
				t.Fatalf("an event that does not encode: %+v", ev)
			}
		}
	})
}
