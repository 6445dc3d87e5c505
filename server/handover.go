package server

import (
	"bytes"
	"encoding/json"

	"github.com/kerneldeck/kerneldeck/internal/jsonobj"
)

// parseHandover reads a connection's first frame, which carried fds file
// descriptors. It is a stdio handover only if exactly two came with it and
// its first line is {"op":"stdio"} with at most a boolean "events", keys
// matched exactly and each once; then rest is what followed that line.
// Anything else is protocol input as it stands (ok false).
func parseHandover(frame []byte, fds int) (events bool, rest []byte, ok bool) {
	line, rest, whole := bytes.Cut(frame, []byte("\n"))
	if fds != 2 || !whole {
		return false, nil, false
	}
	obj, err := jsonobj.Decode(line)
	if err != nil {
		return false, nil, false
	}
	var op string
	if json.Unmarshal(obj["op"], &op) != nil || op != "stdio" {
		return false, nil, false
	}
	for k, v := range obj {
		switch k {
		case "op":
		case "events":
			if json.Unmarshal(v, &events) != nil || !isBool(v) {
				return false, nil, false
			}
		default:
			return false, nil, false
		}
	}
	return events, rest, true
}

func isBool(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return string(v) == "true" || string(v) == "false"
}
