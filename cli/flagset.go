package cli

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// flagSet is a stdlib flag.FlagSet whose flags are listed in titled
// sections. Each flag is defined once, with its help text beside it; a
// mode's --help is generated from those definitions.
type flagSet struct {
	name     string
	fs       *flag.FlagSet
	sections []*flagSection
	optional []string // flags whose value may be left out
	// invalid is a bad value's error in our own words, said instead of
	// the flag package's wrapping of it.
	invalid error
}

// fillOptional gives an optional flag written without a value (last, or
// before another flag) the empty value, as --name=.
func (s *flagSet) fillOptional(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		name := strings.TrimLeft(a, "-")
		if strings.HasPrefix(a, "-") && !strings.Contains(name, "=") && slices.Contains(s.optional, name) &&
			(i+1 == len(args) || strings.HasPrefix(args[i+1], "-")) {
			a += "="
		}
		out = append(out, a)
	}
	return out
}

// flagSection is one titled group of flags in --help.
type flagSection struct {
	title string
	names []string
}

func newFlagSet(name string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// Errors and help are printed by the caller, in our own words.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{name: name, fs: fs}
}

// section starts a new titled group: the flags defined next are listed in it.
func (s *flagSet) section(title string) {
	s.sections = append(s.sections, &flagSection{title: title})
}

func (s *flagSet) add(name string) {
	if len(s.sections) == 0 {
		s.section("Flags:")
	}
	cur := s.sections[len(s.sections)-1]
	cur.names = append(cur.names, name)
}

// Func defines a flag parsed by fn. As with flag.UnquoteUsage, a `word` in
// back quotes in usage is the placeholder --help shows after the name.
func (s *flagSet) Func(name, usage string, fn func(string) error) {
	s.fs.Func(name, usage, fn)
	s.add(name)
}

// Bool defines a boolean flag.
func (s *flagSet) Bool(p *bool, name, usage string) {
	s.fs.BoolVar(p, name, false, usage)
	s.add(name)
}

// BoolFunc defines a flag that takes no value, handed to fn as "true".
func (s *flagSet) BoolFunc(name, usage string, fn func(string) error) {
	s.fs.BoolFunc(name, usage, fn)
	s.add(name)
}

// Path defines a flag whose value is a path, which must not be empty.
func (s *flagSet) Path(p *string, name, usage string) {
	s.Func(name, usage, func(v string) error {
		if v == "" {
			return fmt.Errorf("--%s needs a path", name)
		}
		*p = v
		return nil
	})
}

// Optional defines a string flag whose value may be left out (--attach
// alone, or followed by another flag): it is then "", and given all the
// same.
func (s *flagSet) Optional(p *string, name, usage string) {
	s.fs.Func(name, usage, func(v string) error { *p = v; return nil })
	s.add(name)
	s.optional = append(s.optional, name)
}

// parse parses args, which must be flags only, and returns the names given.
func (s *flagSet) parse(args []string) (map[string]bool, error) {
	args = s.fillOptional(args)
	if err := s.fs.Parse(args); err != nil {
		if s.invalid != nil {
			return nil, s.invalid
		}
		return nil, flagError(err)
	}
	if s.fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: %s takes only flags (run %s --help)", s.fs.Arg(0), s.name, s.name)
	}
	set := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set, nil
}

// Help layout: names in a column, descriptions wrapped beside them.
const (
	helpIndent = 2
	helpDescAt = 27
	helpWidth  = 79
)

// writeHelp lists every section with its flags.
func (s *flagSet) writeHelp(w io.Writer) {
	for i, sec := range s.sections {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, strings.Join(wrapWords(sec.title, helpWidth), "\n"))
		for _, name := range sec.names {
			f := s.fs.Lookup(name)
			arg, usage := flag.UnquoteUsage(f)
			if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool {
				arg = ""
			}
			head := strings.Repeat(" ", helpIndent) + "--" + name
			if arg != "" {
				head += " " + arg
			}
			writeWrapped(w, head, usage)
		}
	}
}

// writeWrapped prints head, then text wrapped into the description column;
// a head too wide for its column gets the text on the lines below it.
func writeWrapped(w io.Writer, head, text string) { writeWrappedAt(w, head, text, helpDescAt) }

func writeWrappedAt(w io.Writer, head, text string, descAt int) {
	lines := wrapWords(text, helpWidth-descAt)
	pad := strings.Repeat(" ", descAt)
	if len(head) >= descAt-1 {
		fmt.Fprintln(w, head)
	} else if len(lines) > 0 {
		fmt.Fprintln(w, head+strings.Repeat(" ", descAt-len(head))+lines[0])
		lines = lines[1:]
	} else {
		fmt.Fprintln(w, head)
	}
	for _, l := range lines {
		fmt.Fprintln(w, pad+l)
	}
}

// wrapWords breaks text between words into lines of at most width bytes;
// "(default X)" stays on one line.
func wrapWords(text string, width int) []string {
	var words []string
	for _, word := range strings.Fields(text) {
		if n := len(words); n > 0 && words[n-1] == "(default" {
			words[n-1] += " " + word
			continue
		}
		words = append(words, word)
	}
	var lines []string
	line := ""
	for _, word := range words {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) > width:
			lines = append(lines, line)
			line = word
		default:
			line += " " + word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// nonEmpty is a flag value that must not be blank, stored in dst.
func nonEmpty(name string, dst *string) func(string) error {
	return func(s string) error {
		if strings.TrimSpace(s) == "" {
			return fmt.Errorf("the %s must not be empty", name)
		}
		*dst = s
		return nil
	}
}

// flagError puts the flag package's errors in our words, with the two
// dashes --help shows (it names flags with one).
func flagError(err error) error {
	msg := err.Error()
	for _, m := range []struct{ prefix, format string }{
		{"flag provided but not defined: -", "unknown flag --%s"},
		{"flag needs an argument: -", "--%s needs a value"},
	} {
		if name, ok := strings.CutPrefix(msg, m.prefix); ok {
			return fmt.Errorf(m.format, strings.TrimPrefix(name, "-"))
		}
	}
	if rest, ok := strings.CutPrefix(msg, "invalid boolean value "); ok {
		// invalid boolean value "x" for -flag: parse error
		if value, name, ok := strings.Cut(rest, " for -"); ok {
			name, _, _ = strings.Cut(name, ":")
			return fmt.Errorf("--%s takes no value, or true or false, not %s", strings.TrimPrefix(name, "-"), value)
		}
	}
	return err
}
