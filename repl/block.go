package repl

import "strings"

// This file decides where a block of input lines ends, without Python: a
// small scanner follows brackets, string literals (with their prefixes,
// triple quotes and f-string replacement fields) and comments across lines,
// and the block rules mirror code.compile_command closely enough for a REPL.

// verdict is what a new line means for the block being typed.
type verdict int

const (
	// vSkip: the line holds no code and no block is open (a blank or
	// comment-only line at the primary prompt); nothing runs.
	vSkip verdict = iota
	// vMore: the block goes on; prompt for a continuation line.
	vMore
	// vRun: the block, this line included, is complete.
	vRun
	// vRunBefore: the block was complete before this line, which starts the
	// next block; the line was not added.
	vRunBefore
)

// block accumulates the lines of one block.
type block struct {
	lines []string
	sc    scanner
	// compound: the first logical line opens a compound statement (it ends
	// with ':', is a decorator, or starts with a compound keyword), so the
	// block ends at a blank line.
	compound bool
	// headerLast: the last complete logical line ends with ':' or is a
	// decorator, so the next line belongs to it whatever its indentation.
	headerLast bool
	logical    int // complete logical lines holding code
}

// compoundKeywords start compound statements; a one-line compound statement
// (`if x: f()`) still waits for a blank line, since an else may follow.
var compoundKeywords = map[string]bool{
	"if": true, "while": true, "for": true, "try": true, "with": true,
	"def": true, "class": true, "async": true,
}

// clauseKeywords continue a compound statement at column 0.
var clauseKeywords = map[string]bool{"else": true, "elif": true, "except": true, "finally": true}

// empty reports whether no line has been added.
func (b *block) empty() bool { return len(b.lines) == 0 }

// code is the block's source, one cell.
func (b *block) code() string { return strings.Join(b.lines, "\n") + "\n" }

// add takes one input line (without its line ending) and says what it means.
func (b *block) add(line string) verdict {
	if !b.sc.open() {
		switch {
		case b.empty() && isBlank(line):
			return vSkip
		case !b.empty() && isBlank(line):
			// Only a compound block is still collecting here.
			return vRun
		case !b.empty() && b.splitsBefore(line):
			return vRunBefore
		}
	}
	b.lines = append(b.lines, line)
	b.sc.feed(line)
	switch {
	case b.sc.bad:
		// A syntax error the scanner can see: let Python report it now
		// rather than wait for more lines.
		return vRun
	case b.sc.open():
		return vMore
	case !b.sc.tokens:
		// Only comments so far in this logical line.
		if !b.compound {
			*b = block{}
			return vSkip
		}
		return vMore
	}
	first := firstWord(b.sc.first)
	decorator := strings.HasPrefix(strings.TrimLeft(b.sc.first, " \t\f"), "@")
	if b.logical == 0 {
		b.compound = b.sc.lastSig == ':' || decorator || compoundKeywords[first]
	}
	b.logical++
	b.headerLast = b.sc.lastSig == ':' || decorator
	if b.compound {
		return vMore
	}
	return vRun
}

// splitsBefore reports whether line, typed in a compound block at a
// logical-line boundary, starts a new statement instead: it starts at column
// 0, holds code, is not an else/elif/except/finally clause, and the
// previous logical line was a body line rather than a header or decorator.
// Python's own REPL calls this a SyntaxError; a pipe fed an ordinary script
// is better served by running both.
func (b *block) splitsBefore(line string) bool {
	if b.headerLast || line == "" || line[0] == ' ' || line[0] == '\t' || line[0] == '\f' || line[0] == '#' {
		return false
	}
	return !clauseKeywords[firstWord(line)]
}

func isBlank(line string) bool { return strings.TrimLeft(line, " \t\f\r") == "" }

// firstWord is the identifier line starts with, after indentation.
func firstWord(line string) string {
	line = strings.TrimLeft(line, " \t\f")
	i := 0
	for i < len(line) && isIdentByte(line[i]) {
		i++
	}
	return line[:i]
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

type frameKind uint8

const (
	fBracket frameKind = iota // ( [ {
	fString                   // a string literal's text
	fField                    // an f-string replacement field's expression
	fSpec                     // an f-string replacement field's format spec
)

type frame struct {
	kind  frameKind
	open  byte   // fBracket: the opening bracket
	quote string // fString: ', ", ''' or """
	fmt   bool   // fString: an f-string (or t-string), whose {...} hold code
}

// scanner follows the lexical state of Python source line by line.
type scanner struct {
	stack []frame
	cont  bool // the last line ended in a backslash continuation
	// bad: a lexical error (unterminated one-line string, unmatched
	// closing bracket); the block is complete and Python reports it.
	bad bool
	// The current logical line (which may span several physical lines).
	tokens  bool   // it holds a token
	first   string // the physical line holding its first token
	lastSig byte   // its last character outside comments and whitespace
}

// open reports whether the logical line goes on: an open bracket or string,
// or a trailing backslash.
func (s *scanner) open() bool { return !s.bad && (len(s.stack) > 0 || s.cont) }

func (s *scanner) top() *frame {
	if len(s.stack) == 0 {
		return nil
	}
	return &s.stack[len(s.stack)-1]
}

// enclosingString is the index of the innermost string frame; a format spec
// always has one below it.
func (s *scanner) enclosingString() int {
	j := len(s.stack) - 1
	for s.stack[j].kind != fString {
		j--
	}
	return j
}

func (s *scanner) push(f frame) { s.stack = append(s.stack, f) }
func (s *scanner) pop()         { s.stack = s.stack[:len(s.stack)-1] }

// token records a token of the current logical line found in line.
func (s *scanner) token(line string) {
	if !s.tokens {
		s.tokens, s.first = true, line
	}
}

// feed scans one physical line (without its line ending).
func (s *scanner) feed(line string) {
	if !s.open() {
		s.tokens, s.first, s.lastSig = false, "", 0
	}
	s.cont = false
	strCont := false // a backslash ended the line inside a string
	n := len(line)
	for i := 0; i < n; {
		c := line[i]
		top := s.top()
		if top != nil && top.kind == fString {
			switch {
			case c == '\\':
				if i == n-1 {
					strCont = true
				}
				i += 2 // the escaped character never ends the string
			case top.fmt && (c == '{' || c == '}'):
				switch {
				case i+1 < n && line[i+1] == c:
					i += 2 // {{ or }}: a literal brace
				case c == '{':
					s.push(frame{kind: fField})
					i++
				default:
					i++ // a stray }: Python reports it
				}
			case strings.HasPrefix(line[i:], top.quote):
				i += len(top.quote)
				s.lastSig = c
				s.pop()
			default:
				i++
			}
			continue
		}
		if top != nil && top.kind == fSpec {
			switch c {
			case '\\':
				i += 2
			case '{':
				s.push(frame{kind: fField})
				i++
			case '}':
				s.pop() // the spec
				s.pop() // its field
				i++
			default:
				// The enclosing string's quote ends it, fields and all.
				if j := s.enclosingString(); strings.HasPrefix(line[i:], s.stack[j].quote) {
					i += len(s.stack[j].quote)
					s.stack = s.stack[:j]
					s.lastSig = c
					continue
				}
				i++
			}
			continue
		}
		// Code: top level, inside brackets, or in a replacement field.
		switch c {
		case '#':
			i = n
		case ' ', '\t', '\f', '\r':
			i++
		case '\\':
			if i == n-1 {
				s.cont = true
			}
			// Elsewhere a backslash outside a string is an error Python reports.
			i++
		case '\'', '"':
			s.token(line)
			q := line[i : i+1]
			if strings.HasPrefix(line[i:], strings.Repeat(q, 3)) {
				q = line[i : i+3]
			}
			s.push(frame{kind: fString, quote: q, fmt: isFormatPrefix(line[:i])})
			i += len(q)
		case '(', '[', '{':
			s.token(line)
			s.push(frame{kind: fBracket, open: c})
			s.lastSig = c
			i++
		case ')', ']', '}':
			s.token(line)
			switch {
			case top != nil && top.kind == fBracket && top.open == opener(c):
				s.pop()
			case top != nil && top.kind == fField && c == '}':
				s.pop() // back in the f-string's text
			default:
				s.bad = true
			}
			s.lastSig = c
			i++
		case ':':
			s.token(line)
			if top != nil && top.kind == fField {
				s.push(frame{kind: fSpec})
			}
			s.lastSig = c
			i++
		default:
			s.token(line)
			s.lastSig = c
			i++
		}
	}
	// A one-line string that reaches the end of its line is unterminated,
	// unless a backslash continues it.
	if top := s.top(); top != nil && top.kind == fString && len(top.quote) == 1 && !strCont {
		s.bad = true
	}
}

func opener(closer byte) byte {
	switch closer {
	case ')':
		return '('
	case ']':
		return '['
	}
	return '{'
}

// isFormatPrefix reports whether before (the text ahead of a quote) ends
// with a string prefix that makes an f-string or t-string: letters from
// r, b, u, f, t that are a whole word, such as f, rf or Tr.
func isFormatPrefix(before string) bool {
	j := len(before)
	for j > 0 && isIdentByte(before[j-1]) {
		j--
	}
	prefix := strings.ToLower(before[j:])
	if prefix == "" || len(prefix) > 2 || strings.Trim(prefix, "rbuft") != "" {
		return false
	}
	return strings.ContainsAny(prefix, "ft") && !strings.Contains(prefix, "b")
}
