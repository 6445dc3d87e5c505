package wire_test

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/wire"
)

// shape is the names a README template gives an object, with the shape of
// each nested object it spells out (nil where it leaves it out, as in
// "displays":[...]).
type shape map[string]shape

// template parses a line template of the README's protocol table, such as
// {"id","op":"kernels","kernels":[{"id",...}]}: JSON names, some with a
// value (an object, a list of one object, [...], alternatives "a\|b", a
// placeholder such as SECONDS or <id, or null>). It returns the shape and
// the op it names.
func template(src string) (shape, wire.Op, error) {
	p := &tmplParser{src: src}
	s, op, err := p.object()
	if err == nil && p.i != len(p.src) {
		err = fmt.Errorf("text after the object: %q", p.src[p.i:])
	}
	return s, op, err
}

type tmplParser struct {
	src string
	i   int
}

func (p *tmplParser) peek(s string) bool { return strings.HasPrefix(p.src[p.i:], s) }

func (p *tmplParser) eat(s string) bool {
	if p.peek(s) {
		p.i += len(s)
		return true
	}
	return false
}

func (p *tmplParser) str() (string, error) {
	if !p.peek(`"`) {
		return "", fmt.Errorf("want a string at %q", p.src[p.i:])
	}
	for j := p.i + 1; j < len(p.src); j++ {
		switch p.src[j] {
		case '\\':
			j++
		case '"':
			// A table writes | as \|: "a\|b" is a choice of values.
			var s string
			err := json.Unmarshal([]byte(strings.ReplaceAll(p.src[p.i:j+1], `\|`, "|")), &s)
			p.i = j + 1
			return s, err
		}
	}
	return "", fmt.Errorf("an unended string at %q", p.src[p.i:])
}

func (p *tmplParser) object() (shape, wire.Op, error) {
	s := shape{}
	var op wire.Op
	if !p.eat("{") {
		return nil, "", fmt.Errorf("want { at %q", p.src[p.i:])
	}
	for !p.eat("}") {
		if len(s) > 0 && !p.eat(",") {
			return nil, "", fmt.Errorf("want , or } at %q", p.src[p.i:])
		}
		name, err := p.str()
		if err != nil {
			return nil, "", err
		}
		if _, twice := s[name]; twice {
			return nil, "", fmt.Errorf("%q named twice", name)
		}
		s[name] = nil
		if !p.eat(":") {
			continue
		}
		switch {
		case p.peek("{"):
			if p.eat("{...}") {
				continue
			}
			if s[name], _, err = p.object(); err != nil {
				return nil, "", err
			}
		case p.peek("["):
			if p.eat("[...]") {
				continue
			}
			p.eat("[")
			if s[name], _, err = p.object(); err != nil {
				return nil, "", err
			}
			if !p.eat("]") {
				return nil, "", fmt.Errorf("want ] at %q", p.src[p.i:])
			}
		case p.peek(`"`):
			v, err := p.str()
			if err != nil {
				return nil, "", err
			}
			if name == "op" {
				op = wire.Op(v)
			}
			for p.eat(`\|`) {
				if _, err := p.str(); err != nil {
					return nil, "", err
				}
			}
		case p.eat("<"):
			end := strings.IndexByte(p.src[p.i:], '>')
			if end < 0 {
				return nil, "", fmt.Errorf("an unended <placeholder> at %q", p.src[p.i:])
			}
			p.i += end + 1
		default:
			j := p.i
			for j < len(p.src) && (p.src[j] >= 'A' && p.src[j] <= 'Z' || p.src[j] >= '0' && p.src[j] <= '9') {
				j++
			}
			if j == p.i {
				return nil, "", fmt.Errorf("a value that is none of the template's at %q", p.src[p.i:])
			}
			p.i = j
		}
	}
	return s, op, nil
}

// shapeOf is the shape of the JSON a value of t is written as: its
// fields, and the fields of the objects nested in it.
func shapeOf(t reflect.Type) shape {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice && t != reflect.TypeFor[json.RawMessage]() {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
		return nil
	}
	s := shape{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case f.Anonymous && name == "":
				walk(f.Type)
			case name != "-" && f.IsExported():
				s[name] = shapeOf(f.Type)
			}
		}
	}
	walk(t)
	return s
}

// differ says where a README template and a type part: names one has and
// the other has not, at any depth the template spells out.
func differ(path string, doc, typ shape) []string {
	var out []string
	for name, sub := range doc {
		tsub, ok := typ[name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s%q is in the README, not in the type", path, name))
		case sub != nil:
			out = append(out, differ(path+name+".", sub, tsub)...)
		}
	}
	for name := range typ {
		if _, ok := doc[name]; !ok {
			out = append(out, fmt.Sprintf("%s%q is in the type, not in the README", path, name))
		}
	}
	slices.Sort(out)
	return out
}

// The README's table of requests and answers names exactly the fields the
// protocol's types have, nested ones too: a field renamed, added or
// dropped on one side and not the other fails here.
func TestREADMENamesTheFieldsOfEveryLine(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "| request | answer |\n| --- | --- |\n")
	if !ok {
		t.Fatal("the README has no request/answer table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	requests := map[wire.Op]bool{}
	answers := map[reflect.Type]bool{}
	check := func(row, src string, typ reflect.Type) {
		doc, _, err := template(src)
		if err != nil {
			t.Errorf("README row %q: template %s: %v", row, src, err)
			return
		}
		for _, d := range differ("", doc, shapeOf(typ)) {
			t.Errorf("%s (README %s, type wire.%s)", d, src, typ.Name())
		}
	}
	for row := range strings.SplitSeq(table, "\n") {
		cols := strings.SplitN(row, " | ", 2)
		if len(cols) != 2 {
			t.Fatalf("README table row %q has no two columns", row)
		}
		var rowOps []wire.Op
		for _, src := range spans(cols[0]) {
			_, op, err := template(src)
			if err != nil || op == "" {
				t.Errorf("README request %s: %v (op %q)", src, err, op)
				continue
			}
			req := wire.NewRequest(op)
			if req == nil {
				t.Errorf("README request %s: %s is no request of the protocol", src, op)
				continue
			}
			requests[op] = true
			rowOps = append(rowOps, op)
			check(row, src, reflect.TypeOf(req).Elem())
		}
		for _, src := range spans(cols[1]) {
			doc, op, err := template(src)
			if err != nil || op == "" {
				continue // a display's shape or an example value, not a line
			}
			typ := answerType(op, rowOps, doc)
			if typ == nil {
				t.Errorf("README answer %s: no line of the protocol has op %q", src, op)
				continue
			}
			answers[typ] = true
			check(row, src, typ)
		}
	}
	for _, op := range wire.Ops() {
		if !requests[op] {
			t.Errorf("the README's table has no request %s", op)
		}
	}
	for _, l := range answerLines {
		if !answers[l.typ] {
			t.Errorf("the README's table shows no line of wire.%s", l.typ.Name())
		}
	}
}

// answerLines is each line the server writes: its op and type, and, where
// one op has several types, which one a README row shows (by the row's
// requests and the line's fields). The first that fits is it.
var answerLines = []struct {
	op   wire.Op
	typ  reflect.Type
	when func(rowOps []wire.Op, doc shape) bool
}{
	{wire.OpOK, reflect.TypeFor[wire.Subscribed](), func(ops []wire.Op, _ shape) bool { return slices.Contains(ops, wire.OpSubscribe) }},
	{wire.OpOK, reflect.TypeFor[wire.Killed](), func(ops []wire.Op, _ shape) bool { return slices.Contains(ops, wire.OpShutdownAll) }},
	{wire.OpOK, reflect.TypeFor[wire.ParkDone](), func(ops []wire.Op, _ shape) bool { return slices.Contains(ops, wire.OpPark) }},
	{wire.OpOK, reflect.TypeFor[wire.Dropped](), func(ops []wire.Op, _ shape) bool { return slices.Contains(ops, wire.OpDropParked) }},
	{wire.OpOK, reflect.TypeFor[wire.OK](), nil},
	{wire.OpResult, reflect.TypeFor[wire.Result](), nil},
	{wire.OpStarted, reflect.TypeFor[wire.Started](), nil},
	{wire.OpOutput, reflect.TypeFor[wire.DisplayOutput](), func(_ []wire.Op, doc shape) bool { _, ok := doc["display"]; return ok }},
	{wire.OpOutput, reflect.TypeFor[wire.Output](), nil},
	{wire.OpKernels, reflect.TypeFor[wire.Kernels](), nil},
	{wire.OpHello, reflect.TypeFor[wire.Hello](), nil},
	{wire.OpCells, reflect.TypeFor[wire.Cells](), nil},
	{wire.OpCompletions, reflect.TypeFor[wire.Completions](), nil},
	{wire.OpInputRequest, reflect.TypeFor[wire.InputRequest](), nil},
	{wire.OpError, reflect.TypeFor[wire.Error](), nil},
	{wire.OpGoodbye, reflect.TypeFor[wire.Goodbye](), nil},
	{wire.OpEvent, reflect.TypeFor[wire.Event](), nil},
}

// answerType is the type of the answer line with op that a README row
// shows, or nil when the protocol has no such line.
func answerType(op wire.Op, rowOps []wire.Op, doc shape) reflect.Type {
	for _, l := range answerLines {
		if l.op == op && (l.when == nil || l.when(rowOps, doc)) {
			return l.typ
		}
	}
	return nil
}

// spans returns the code spans of a Markdown table cell that hold a line
// template (they begin with {").
func spans(cell string) []string {
	var out []string
	parts := strings.Split(cell, "`")
	for i := 1; i < len(parts); i += 2 {
		if strings.HasPrefix(parts[i], `{"`) {
			out = append(out, parts[i])
		}
	}
	return out
}
