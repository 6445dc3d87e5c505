package mcpserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxLine bounds one line from the client, as the SDK's own transport does.
const maxLine = mcp.DefaultMaxLineLength

// StdioTransport serves MCP on in and out, one JSON-RPC message a line, as
// the SDK's stdio transport does, but a line that is not a JSON-RPC message
// gets a JSON-RPC error answer (parse error, or invalid request) and the
// session goes on: the SDK's own transport ends the session at the first
// such line. The reading goroutine ends with in, or with the session.
func StdioTransport(in io.Reader, out io.Writer) mcp.Transport {
	w := &lockedWriter{w: out}
	pr, pw := io.Pipe()
	go filterLines(in, pw, w)
	return &mcp.IOTransport{Reader: pr, Writer: w}
}

// lockedWriter keeps the SDK's lines and the error answers whole.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return nil }

// filterLines copies the lines of in that are JSON-RPC messages (or
// batches of them) to pw, and answers the others on out.
func filterLines(in io.Reader, pw *io.PipeWriter, out io.Writer) {
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		line, tooLong, err := readLine(br)
		if tooLong || len(bytes.TrimSpace(line)) > 0 {
			why, code := checkMessage(line)
			if tooLong {
				why, code = fmt.Sprintf("Parse error: a line over %d bytes; the message was dropped and the session goes on", maxLine), -32700
			}
			if why != "" {
				answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil,
					"error": map[string]any{"code": code, "message": why}})
				if _, werr := out.Write(append(answer, '\n')); werr != nil {
					pw.CloseWithError(werr)
					return
				}
			} else if _, werr := pw.Write(append(line, '\n')); werr != nil {
				return // the session is over
			}
		}
		if err != nil {
			pw.CloseWithError(err)
			return
		}
	}
}

// readLine reads one line without its newline; for a line over maxLine
// it says so (tooLong), having read and dropped the line.
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > maxLine {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			return nil, true, err
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), false, err
	}
}

// checkMessage says what is wrong with line as a JSON-RPC message or
// batch, with its JSON-RPC error code, or "" when nothing is.
func checkMessage(line []byte) (string, int) {
	const parseError, invalidRequest = -32700, -32600
	if !json.Valid(line) {
		return "Parse error: the line is not JSON; the message was dropped and the session goes on", parseError
	}
	var msgs []json.RawMessage
	if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 && trimmed[0] == '[' {
		if json.Unmarshal(trimmed, &msgs) != nil || len(msgs) == 0 {
			return "Invalid Request: an empty or malformed batch", invalidRequest
		}
	} else {
		msgs = []json.RawMessage{line}
	}
	for _, m := range msgs {
		if _, err := jsonrpc.DecodeMessage(m); err != nil {
			return "Invalid Request: " + err.Error(), invalidRequest
		}
	}
	return "", 0
}
