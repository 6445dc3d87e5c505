package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kerneldeck/kerneldeck/internal/jsonobj"
)

// python_exec is the hot path, so it is bound with the SDK's low-level
// AddTool: its arguments are decoded once, strictly (keys exact and once,
// each of its type, nothing unknown), and its result, which this package
// makes, is not checked against its own schema on every call. The schemas
// the client sees are the same ones the generic AddTool would infer.

// decodeExecInput reads python_exec's arguments.
func decodeExecInput(raw json.RawMessage) (ExecInput, error) {
	var in ExecInput
	if len(bytes.TrimSpace(raw)) == 0 {
		return in, fmt.Errorf(`missing argument "code" (the Python source to run)`)
	}
	obj, err := jsonobj.Decode(raw)
	if err != nil {
		return in, fmt.Errorf("arguments are not a JSON object: %v", err)
	}
	fields := map[string]any{"code": &in.Code, "session": &in.Session, "timeout_s": &in.TimeoutS, "reset": &in.Reset}
	kinds := map[string]string{"code": "string", "session": "string", "timeout_s": "number", "reset": "boolean"}
	for k, v := range obj {
		dst, ok := fields[k]
		if !ok {
			names := make([]string, 0, len(fields))
			for n := range fields {
				names = append(names, n)
			}
			sort.Strings(names)
			return in, fmt.Errorf("unknown argument %.80q; python_exec takes %s", k, strings.Join(names, ", "))
		}
		if jsonobj.Kind(v) != kinds[k] {
			return in, fmt.Errorf("argument %q must be a JSON %s, not %s", k, kinds[k], jsonobj.Kind(v))
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return in, fmt.Errorf("argument %q: %v", k, err)
		}
	}
	if _, ok := obj["code"]; !ok {
		return in, fmt.Errorf(`missing argument "code" (the Python source to run)`)
	}
	return in, nil
}

// addExecTool registers python_exec.
func (s *Server) addExecTool(t *mcp.Tool) {
	in, err := jsonschema.For[ExecInput](nil)
	if err != nil {
		panic(fmt.Sprintf("python_exec input schema: %v", err))
	}
	out, err := jsonschema.For[ExecOutput](nil)
	if err != nil {
		panic(fmt.Sprintf("python_exec output schema: %v", err))
	}
	t.InputSchema, t.OutputSchema = in, out
	s.mcp.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		input, err := decodeExecInput(req.Params.Arguments)
		if err != nil && req.Params.RequestState == "" {
			return errorResult(fmt.Errorf("validating \"arguments\": %w", err)), nil
		}
		res, o, err := s.pythonExec(ctx, req, input)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			return errorResult(err), nil
		}
		if res.InputRequests != nil {
			return res, nil
		}
		b, err := json.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("encode the result: %w", err)
		}
		res.StructuredContent = json.RawMessage(b)
		return res, nil
	})
}

func errorResult(err error) *mcp.CallToolResult {
	var r mcp.CallToolResult
	r.SetError(err)
	return &r
}
