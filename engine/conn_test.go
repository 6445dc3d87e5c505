package engine

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// pipeConn is a runner connection over net.Pipe, the runner's side returned
// for the test to write.
func pipeConn(t *testing.T) (*runnerConn, net.Conn) {
	t.Helper()
	engineSide, runnerSide := net.Pipe()
	t.Cleanup(func() { engineSide.Close(); runnerSide.Close() })
	return newConn(engineSide, bufio.NewReaderSize(engineSide, 64<<10), nil), runnerSide
}

// A read deadline that falls in the middle of a line loses nothing: the next
// read goes on with the rest of it (the engine reads across the deadline
// that sends the interrupt, and the result may be arriving just then).
func TestRunnerConnLineAcrossDeadline(t *testing.T) {
	rc, runner := pipeConn(t)
	defer rc.begin(context.Background(), time.Now().Add(200*time.Millisecond))()
	head, tail := `{"op":"result","id":"c1",`, `"status":"ok","stdout":"42\n"}`+"\n"
	go runner.Write([]byte(head))
	if _, err := rc.next("c1"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("next before the line's end: %v, want the deadline", err)
	}
	rc.readUntil(time.Now().Add(10 * time.Second))
	go runner.Write([]byte(tail))
	f, err := rc.next("c1")
	if err != nil || f.Op != "result" || f.Status != "ok" || f.Stdout != "42\n" {
		t.Fatalf("the line cut by the deadline: %+v, %v; want the whole result", f, err)
	}
	if rc.closed() {
		t.Fatal("a deadline closed the connection")
	}
}

// Canceling the cell's context wakes a read at once; the cancel of one cell
// does not reach the next cell's reads.
func TestRunnerConnCancel(t *testing.T) {
	rc, runner := pipeConn(t)
	ctx, cancel := context.WithCancel(context.Background())
	stop := rc.begin(ctx, time.Time{})
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := rc.next("c1"); !errors.Is(err, errReadCanceled) {
		t.Fatalf("next after the cancel: %v, want errReadCanceled", err)
	}
	// A deadline moved after the cancel does not undo it.
	rc.readUntil(time.Now().Add(time.Hour))
	if _, err := rc.next("c1"); !errors.Is(err, errReadCanceled) {
		t.Fatalf("next after a cancel and a new deadline: %v, want errReadCanceled", err)
	}
	stop()
	defer rc.begin(context.Background(), time.Now().Add(10*time.Second))()
	go runner.Write([]byte(`{"op":"result","id":"c2","status":"ok"}` + "\n"))
	if f, err := rc.next("c2"); err != nil || f.ID != "c2" {
		t.Fatalf("the next cell's read: %+v, %v", f, err)
	}
}

// Lines of other cells are dropped and counted; past floodLimit the stream
// is closed and the flood reported once.
func TestRunnerConnFlood(t *testing.T) {
	engineSide, runner := net.Pipe()
	defer runner.Close()
	var told []int64
	rc := newConn(engineSide, bufio.NewReaderSize(engineSide, 64<<10), func(n int64) { told = append(told, n) })
	defer rc.begin(context.Background(), time.Now().Add(time.Minute))()
	go func() {
		line := []byte(`{"op":"output","id":"old","text":"` + strings.Repeat("x", 1<<20) + `"}` + "\n")
		for range floodLimit>>20 + 2 {
			if _, err := runner.Write(line); err != nil {
				return
			}
		}
	}()
	if _, err := rc.next("c1"); err == nil || !rc.closed() {
		t.Fatalf("next under a flood: %v, closed %v; want an error and the stream closed", err, rc.closed())
	}
	if len(told) != 1 || told[0] <= floodLimit {
		t.Fatalf("flood reports %v, want one over %d", told, floodLimit)
	}
}
