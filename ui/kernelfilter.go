package ui

import (
	"regexp"
	"strings"

	"github.com/kerneldeck/kerneldeck/engine"
)

// kernelFilter selects kernels by owner, task, child, id, backend, state
// and tools: a case-insensitive regular expression (so a plain word is a
// substring), taken literally if it does not compile; a leading ! keeps
// the kernels that do not match.
type kernelFilter struct {
	text   string
	re     *regexp.Regexp
	lit    string
	invert bool
}

func parseKernelFilter(s string) kernelFilter {
	f := kernelFilter{text: s}
	if rest, ok := strings.CutPrefix(s, "!"); ok {
		f.invert, s = true, rest
	}
	if re, err := regexp.Compile("(?i)" + s); err == nil {
		f.re = re
	} else {
		f.lit = strings.ToLower(s)
	}
	return f
}

// active says whether the filter hides anything at all.
func (f kernelFilter) active() bool { return f.text != "" && f.text != "!" }

func (f kernelFilter) match(k engine.KernelInfo) bool {
	if !f.active() {
		return true
	}
	hay := strings.Join([]string{k.Owner, k.Task, k.Child, k.ID, k.Backend, string(k.State), strings.Join(k.Tools, ",")}, " ")
	var hit bool
	if f.re != nil {
		hit = f.re.MatchString(hay)
	} else {
		hit = strings.Contains(strings.ToLower(hay), f.lit)
	}
	return hit != f.invert
}
