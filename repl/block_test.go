package repl

import (
	"os/exec"
	"strings"
	"testing"
)

func (v verdict) String() string {
	return [...]string{"skip", "more", "run", "runBefore"}[v]
}

func TestBlockVerdicts(t *testing.T) {
	const (
		S = vSkip
		M = vMore
		R = vRun
		B = vRunBefore
	)
	for _, tc := range []struct {
		name  string
		lines []string
		want  []verdict // one per line, fed in order to one block
	}{
		{"simple statement", []string{"x = 41"}, []verdict{R}},
		{"expression", []string{"x + 1"}, []verdict{R}},
		{"semicolons", []string{"import time; time.sleep(1)"}, []verdict{R}},
		{"blank line at the prompt", []string{""}, []verdict{S}},
		{"whitespace line at the prompt", []string{"   \t"}, []verdict{S}},
		{"comment-only line", []string{"# just a note"}, []verdict{S}},
		{"indented comment-only line", []string{"    # note"}, []verdict{S}},
		{"def ended by a blank line", []string{"def f(x):", "    return x * 2", ""}, []verdict{M, M, R}},
		{"for loop", []string{"for i in range(3):", "    print(i)", ""}, []verdict{M, M, R}},
		{"colon then comment", []string{"if x:  # why", "    y()", ""}, []verdict{M, M, R}},
		{"comment inside a compound block", []string{"if x:", "# note", "    y()", ""}, []verdict{M, M, M, R}},
		{"one-line compound waits like Python", []string{"if x: y()", ""}, []verdict{M, R}},
		{"one-line for waits", []string{"for i in range(3): print(i)", ""}, []verdict{M, R}},
		{"one-line def waits", []string{"def f(): return 1", ""}, []verdict{M, R}},
		{"else at column 0 continues", []string{"if x: a()", "else: b()", ""}, []verdict{M, M, R}},
		{"try/except/finally", []string{"try:", "    1/0", "except ZeroDivisionError:", "    pass", "finally:", "    done()", ""}, []verdict{M, M, M, M, M, M, R}},
		{"elif", []string{"if a:", "    x()", "elif b:", "    y()", ""}, []verdict{M, M, M, M, R}},
		{"identifier starting like a keyword", []string{"if_x = 1"}, []verdict{R}},
		{"class_ is not class", []string{"class_ = 1"}, []verdict{R}},
		{"decorator", []string{"@functools.cache", "def f():", "    return 1", ""}, []verdict{M, M, M, R}},
		{"two decorators", []string{"@a", "@b(1)", "class C:", "    pass", ""}, []verdict{M, M, M, M, R}},
		{"async def", []string{"async def f():", "    await g()", ""}, []verdict{M, M, R}},
		{"match statement", []string{"match p:", "    case 1:", "        a()", "    case _:", "        b()", ""}, []verdict{M, M, M, M, M, R}},
		{"match as a name is simple", []string{"match = re.match('a', s)"}, []verdict{R}},
		{"dedent after a body starts the next block", []string{"def f():", "    return 1", "print(f())"}, []verdict{M, M, B}},
		{"dedent after a one-line compound", []string{"for i in x: print(i)", "print('done')"}, []verdict{M, B}},
		{"column-0 line after a header stays (Python reports it)", []string{"def f():", "return 1"}, []verdict{M, M}},
		{"column-0 comment in a body stays", []string{"def f():", "    a = 1", "# c", "    return a", ""}, []verdict{M, M, M, M, R}},
		{"open paren", []string{"f(1,", "  2)"}, []verdict{M, R}},
		{"open bracket over a blank line", []string{"xs = [", "", "  1,", "]"}, []verdict{M, M, M, R}},
		{"nested brackets", []string{"d = {'a': [1, (2,", "3)],", "}"}, []verdict{M, M, R}},
		{"dict colon is not a header", []string{"d = {'a':", "1}"}, []verdict{M, R}},
		{"slice colon", []string{"y = x[1:]"}, []verdict{R}},
		{"annotation", []string{"x: int = 1"}, []verdict{R}},
		{"lambda", []string{"f = lambda: 1"}, []verdict{R}},
		{"header over several lines", []string{"if (a and", "        b):", "    c()", ""}, []verdict{M, M, M, R}},
		{"call over several lines is simple", []string{"print(1,", "      2)"}, []verdict{M, R}},
		{"backslash continuation", []string{"x = 1 + \\", "    2"}, []verdict{M, R}},
		{"backslash continuation of a header", []string{"if a and \\", "   b:", "    c()", ""}, []verdict{M, M, M, R}},
		{"backslash in a comment is no continuation", []string{"x = 1  # \\"}, []verdict{R}},
		{"triple-quoted string", []string{`s = """one`, "", "two", `"""`}, []verdict{M, M, M, R}},
		{"triple single quotes", []string{"s = '''a", "b'''"}, []verdict{M, R}},
		{"triple quotes in a def", []string{"def f():", `    """Doc`, "", "columns 0 inside the string", `    """`, "    return 1", ""}, []verdict{M, M, M, M, M, M, R}},
		{"quote of the other kind inside", []string{`s = "it's"`}, []verdict{R}},
		{"escaped quote", []string{`s = "a \" b"`}, []verdict{R}},
		{"escaped backslash before the quote", []string{`s = "a \\"`}, []verdict{R}},
		{"raw string with an escaped quote", []string{`s = r"a\"b"`}, []verdict{R}},
		{"bytes prefix", []string{`s = b'x' + rb"y" + BR'z'`}, []verdict{R}},
		{"brackets inside strings do not count", []string{`s = "(" + '[' + """{"""`}, []verdict{R}},
		{"hash inside a string is no comment", []string{`s = "#" + "("`}, []verdict{R}},
		{"colon inside a string is no header", []string{`print("if x:")`}, []verdict{R}},
		{"colon in a comment is no header", []string{"x = 1  # note:"}, []verdict{R}},
		{"string ending the line is no header", []string{`s = ":"`}, []verdict{R}},
		{"one-line string continued by backslash", []string{`s = "abc\`, `def"`}, []verdict{M, R}},
		{"unterminated string runs (Python reports it)", []string{`s = "abc`}, []verdict{R}},
		{"unterminated string inside brackets runs", []string{`f("abc`}, []verdict{R}},
		{"unmatched closer runs", []string{"x = 1)"}, []verdict{R}},
		{"mismatched closer runs", []string{"x = (1]"}, []verdict{R}},
		{"f-string", []string{`s = f"{x} and {y!r:>10}"`}, []verdict{R}},
		{"f-string with nested same quotes (3.12)", []string{`s = f"{d["k"]}"`}, []verdict{R}},
		{"f-string braces escaped", []string{`s = f"{{not a field"`}, []verdict{R}},
		{"f-string field with a brace string", []string{`s = f"{'}'}"`}, []verdict{R}},
		{"f-string nested spec", []string{`s = f"{x:{w}.{p}f}"`}, []verdict{R}},
		{"f-string nested field spec", []string{`s = f"{x:{w:3}}"`}, []verdict{R}},
		{"f-string dict in a field", []string{`s = f"{ {'a': 1}['a'] }"`}, []verdict{R}},
		{"f-string walrus-looking spec", []string{`s = f"{x:=10}"`}, []verdict{R}},
		{"rf prefix", []string{`s = rf"\d{n}"`}, []verdict{R}},
		{"not a prefix: identifier before quote", []string{`x = elf"{"`}, []verdict{R}},
		{"multi-line f-string field (3.12)", []string{`s = f"{", ".join([`, "  'a',  # a comment with a quote '", "])}\""}, []verdict{M, M, R}},
		{"triple-quoted f-string with a field over lines", []string{`s = f"""{`, "x", `}"""`}, []verdict{M, M, R}},
		{"unicode identifiers", []string{"été = 1"}, []verdict{R}},
		{"CR is whitespace", []string{"x = 1\r"}, []verdict{R}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.lines) != len(tc.want) {
				t.Fatalf("bad case: %d lines, %d verdicts", len(tc.lines), len(tc.want))
			}
			var b block
			for i, line := range tc.lines {
				if got := b.add(line); got != tc.want[i] {
					t.Fatalf("line %d %q: got %v, want %v (lines so far %q)", i, line, got, tc.want[i], b.lines)
				}
			}
		})
	}
}

func TestBlockCode(t *testing.T) {
	var b block
	for _, l := range []string{"def f():", "    return 1"} {
		b.add(l)
	}
	if got := b.add(""); got != vRun {
		t.Fatalf("blank line: %v", got)
	}
	if got, want := b.code(), "def f():\n    return 1\n"; got != want {
		t.Fatalf("code %q, want %q", got, want)
	}
	// vRunBefore leaves the line out of the block.
	b = block{}
	b.add("for i in x:")
	b.add("    pass")
	if got := b.add("y = 1"); got != vRunBefore {
		t.Fatalf("dedent: %v", got)
	}
	if got, want := b.code(), "for i in x:\n    pass\n"; got != want {
		t.Fatalf("code %q, want %q", got, want)
	}
}

// TestBlockAgreesWithPython checks, for snippets where the REPL means to
// behave like Python's code.compile_command, that "needs more input" agrees:
// the snippet fed line by line ends with vMore exactly when Python says it
// is incomplete.
func TestBlockAgreesWithPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	snippets := []string{
		"x = 1", "x +", "f(1,", "f(1,\n2)", "if x:", "if x:\n    y()", "if x: y()",
		"def f(): return 1", "@dec", "@dec\ndef f():\n    pass", `s = """a`, `s = """a` + "\n" + `b"""`,
		"x = 1 + \\", "x = 1 + \\\n2", "d = {'a':", "d = {'a':\n1}", "for i in range(3): print(i)",
		"class A:\n    pass", "s = 'a' '(' \"[\"", "y = x[1:]", `s = f"{x!r}"`, "while True:\n    break",
		"with open(p) as f:\n    f.read()", "try:\n    x()", "(1 +\n 2 +", "print('#(')",
	}
	for _, src := range snippets {
		var b block
		var v verdict
		for line := range strings.SplitSeq(src, "\n") {
			v = b.add(line)
		}
		ours := v == vMore
		out, err := exec.Command(py, "-c", `import code, sys
try:
    print("incomplete" if code.compile_command(sys.argv[1]) is None else "complete")
except SyntaxError:
    print("error")`, src).Output()
		if err != nil {
			t.Fatalf("python3: %v", err)
		}
		python := strings.TrimSpace(string(out)) == "incomplete"
		if ours != python {
			t.Errorf("%q: needs more input: ours %v, Python %v (%s)", src, ours, python, strings.TrimSpace(string(out)))
		}
	}
}
