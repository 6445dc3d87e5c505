package repl

import (
	"regexp"
	"strconv"
	"strings"
)

// This file holds what the REPL takes from ipython and Python's own REPL
// beyond plain Python: obj? and obj?? (run in the kernel as Python that
// prints), and exit/quit, which end the REPL instead of the kernel.

// inspectLine matches "name?", "name??", "?name" and "??name" for a dotted
// name (its call parentheses, ipython-style, allowed at the end).
var inspectLine = regexp.MustCompile(`^\s*(\?{1,2})?\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\(\))?\s*(\?{1,2})?\s*$`)

// inspectCode is the cell that obj? (detail false) or obj?? (true) runs:
// it looks the name up in the kernel's globals and prints its type,
// signature and docstring, or its source, without leaving a name behind.
func inspectCode(line string) (string, bool) {
	m := inspectLine.FindStringSubmatch(line)
	if m == nil || (m[1] == "") == (m[3] == "") {
		return "", false // no mark, or marks on both sides
	}
	detail := "False"
	if m[1]+m[3] == "??" {
		detail = "True"
	}
	return "exec(" + strconv.Quote(inspectSource) + ", {'__kd_g': globals(), '__kd_name': " +
		strconv.Quote(m[2]) + ", '__kd_detail': " + detail + "})\n", true
}

// inspectSource prints what ipython's ? and ?? print, from the standard
// library only.
const inspectSource = `import inspect as _i
try:
    _o = eval(__kd_name, __kd_g)
except Exception:
    print("Object %r not found." % __kd_name)
else:
    _rows = [("Type", type(_o).__name__)]
    _s = repr(_o)
    _rows.append(("String form", _s if len(_s) <= 200 else _s[:197] + "..."))
    try:
        _rows.append(("Signature", __kd_name.rsplit(".", 1)[-1] + str(_i.signature(_o))))
    except (TypeError, ValueError):
        pass
    _src = None
    if __kd_detail:
        try:
            _src = _i.getsource(_o)
        except (TypeError, OSError):
            pass
    _d = _i.getdoc(_o)
    if _src is None and _d:
        _rows.append(("Docstring", _d))
    try:
        _rows.append(("File", _i.getsourcefile(_o) or _i.getfile(_o)))
    except TypeError:
        pass
    for _k, _v in _rows:
        print("%-12s %s" % (_k + ":", str(_v).replace("\n", "\n" + " " * 13)))
    if _src is not None:
        print("Source:")
        print(_src, end="" if _src.endswith("\n") else "\n")
`

// isExit reports whether a complete block asks to leave: exit(), quit(),
// or the bare names, as Python 3.13's REPL takes them.
func isExit(code string) bool {
	switch strings.TrimSpace(code) {
	case "exit", "exit()", "quit", "quit()":
		return true
	}
	return false
}
