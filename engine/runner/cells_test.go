package runner

import (
	"strconv"
	"strings"
	"testing"
)

// A cell's last statement is shown when it is an expression, as the
// interactive interpreter shows it, and only then; the cells that allow it
// are split by their lines, without the AST (whose Python objects bring
// ~0.3 MB of the interpreter into a kernel), and the others on the AST,
// with the same result.
func TestRunnerShowsTheLastExpression(t *testing.T) {
	type cell struct {
		code, stdout string
		status, tb   string // tb: what the traceback holds
		stderr       string // what stderr holds, once
	}
	byLines := []cell{
		{code: "1", stdout: "1\n"},
		{code: "x = 41\nx + 1", stdout: "42\n"},
		{code: "x = 1\n# done\n", stdout: ""},
		{code: "for i in range(2):\n    i\n", stdout: ""},
		{code: "if False:\n    5\nelse:\n    6\n", stdout: ""},
		{code: "try:\n    7\nexcept Exception:\n    8\nfinally:\n    9\n", stdout: ""},
		{code: "@staticmethod\n\n@staticmethod\ndef g(): pass\ntype(g).__name__", stdout: "'staticmethod'\n"},
		{code: "@staticmethod\ndef h(): pass", stdout: ""},
		{code: "def f():\n    return 3\nf()", stdout: "3\n"},
		{code: "s = '''\nabc\n'''\nlen(s)", stdout: "5\n"},
		{code: "print('a')\n'b'", stdout: "a\n'b'\n"},
		{code: "x = None\nx", stdout: ""},
		{code: "y = 1\nz = 2\ny is 1", stdout: "True\n", stderr: `SyntaxWarning: "is" with a literal`},
		// The text is the cell's, whatever a coding line says.
		{code: "# -*- coding: latin-1 -*-\ns = '\u00e9\u00e8'\nlen(s), s", stdout: "(2, '\u00e9\u00e8')\n"},
	}
	// Split by lines too, but its traceback loads the AST of its own
	// (traceback places its carets with it, from Python 3.11): run last.
	failing := cell{code: "x = 1\n\n1 / 0", status: "error", tb: `line 3, in <module>`}
	onAST := []cell{
		{code: "(1,\n2)", stdout: "(1, 2)\n"},
		{code: "a = 1; a", stdout: "1\n"},
		{code: "1; 2", stdout: "2\n"},
		{code: "a = 1\na; b = 2", stdout: ""},
		{code: "x = 1\ny = \x00", status: "error", tb: "null bytes"},
		{code: "x = 1\ny = (", status: "error", tb: "SyntaxError"},
		{code: "match = 3\nmatch", stdout: "3\n"},
	}
	e := startEngineSide(t)
	n := 0
	run := func(c cell) {
		t.Helper()
		n++
		e.write(cellFrame("c"+strconv.Itoa(n), c.code))
		f, _ := e.result()
		status := c.status
		if status == "" {
			status = "ok"
		}
		if f.Status != status || f.Stdout != c.stdout || !strings.Contains(f.Traceback, c.tb) {
			t.Errorf("cell %q: %s, stdout %q, traceback %q; want %s, stdout %q, a traceback with %q", c.code, f.Status, f.Stdout, f.Traceback, status, c.stdout, c.tb)
		}
		if c.stderr != "" && strings.Count(f.Stderr, c.stderr) != 1 {
			t.Errorf("cell %q: stderr %q; want %q in it once", c.code, f.Stderr, c.stderr)
		}
	}
	// How many of the AST's Python types exist, and whether _ast is
	// loaded: in the runner before and after the cells (some sites create
	// the types at start: pyenv's 3.11 does).
	const probe = "import gc, sys\nprint(sum(isinstance(o, type) and o.__module__ == 'ast' for o in gc.get_objects()), '_ast' in sys.modules)"
	loaded := func() string {
		t.Helper()
		n++
		e.write(cellFrame("c"+strconv.Itoa(n), probe))
		f, _ := e.result()
		return f.Stdout
	}
	before := loaded()
	for _, c := range byLines {
		run(c)
	}
	if got := loaded(); got != before {
		t.Errorf("after cells split by their lines, AST types and _ast: %q; before them: %q", got, before)
	}
	for _, c := range onAST {
		run(c)
	}
	// The check above can see it.
	if got := loaded(); !strings.HasSuffix(got, " True\n") || strings.HasPrefix(got, "0 ") {
		t.Errorf("after cells split on the AST, AST types and _ast: %q; want both", got)
	}
	run(failing)
}
