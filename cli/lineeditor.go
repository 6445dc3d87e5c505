package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/chzyer/readline"

	"github.com/kerneldeck/kerneldeck/repl"
)

// historyMax is how many REPL lines the history keeps.
const historyMax = 1000

// lineEditor is the REPL's input on a terminal: line editing, history
// (arrow keys, ctrl+r search) kept in <state dir>/repl_history (0600).
type lineEditor struct {
	rl    *readline.Instance
	hist  *os.File // nil: history for this session only
	tab   *tabCompleter
	paste *pasteReader
	out   io.Writer
}

// tabCompleter is tab in the line editor: at the start of a line (or after
// blanks) it indents, as Python's REPL does; after a word it completes
// from the kernel.
type tabCompleter struct {
	complete func(line []rune, pos int) (start int, matches []string)
	// off while a cell's input() is answered: the answer is no code.
	off bool
}

// Do implements readline.AutoCompleter: the candidates' text after what
// is typed, and how much of it is typed.
func (c *tabCompleter) Do(line []rune, pos int) ([][]rune, int) {
	if c.off {
		return nil, 0
	}
	if strings.TrimLeft(string(line[:pos]), " \t") == "" {
		return [][]rune{[]rune("    ")}, 0
	}
	if c.complete == nil {
		return nil, 0
	}
	start, matches := c.complete(line, pos)
	if start < 0 || start > pos {
		return nil, 0
	}
	typed := string(line[start:pos])
	var out [][]rune
	for _, m := range matches {
		// A match must go on from what is typed: readline appends.
		if rest, ok := strings.CutPrefix(m, typed); ok {
			out = append(out, []rune(rest))
		}
	}
	return out, pos - start
}

// SetCompletion implements repl.Completing.
func (e *lineEditor) SetCompletion(f func(line []rune, pos int) (int, []string)) { e.tab.complete = f }

// newLineEditor reads from the terminal stdin. A history file that is not
// a private regular file of this user is not used (a warning says why).
func newLineEditor(stateDir string, stdin *os.File, out, errOut io.Writer) (*lineEditor, error) {
	tab := &tabCompleter{}
	// Cancelable: a read the line editor left pending ends at Close.
	paste := newPasteReader(readline.NewCancelableStdin(stdin))
	rl, err := readline.NewEx(&readline.Config{
		Stdin: paste, Stdout: out, Stderr: errOut, AutoComplete: tab,
		HistoryLimit: historyMax, DisableAutoSaveHistory: true, HistorySearchFold: true,
		InterruptPrompt: "^C", EOFPrompt: "",
	})
	if err != nil {
		return nil, fmt.Errorf("line editor: %w", err)
	}
	e := &lineEditor{rl: rl, tab: tab, paste: paste, out: out}
	if stateDir == "" {
		return e, nil
	}
	f, err := openHistory(filepath.Join(stateDir, "repl_history"))
	if err != nil {
		fmt.Fprintf(errOut, "kerneldeck repl: %v; history is kept for this session only\n", err)
		return e, nil
	}
	e.hist = f
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var lines []string
	for sc.Scan() {
		if l, err := strconv.Unquote(sc.Text()); err == nil {
			lines = append(lines, l)
		}
	}
	lines = lines[max(0, len(lines)-historyMax):]
	if sc.Err() == nil && len(lines) == historyMax {
		// Keep the file about as long as the history: rewrite it with the
		// lines kept (appends go to the new end).
		if f.Truncate(0) == nil {
			w := bufio.NewWriter(f)
			for _, l := range lines {
				fmt.Fprintln(w, strconv.Quote(l))
			}
			w.Flush()
		}
	}
	for _, l := range lines {
		rl.SaveHistory(l)
	}
	return e, nil
}

// openHistory opens (or makes) the history file: a regular file of this
// user, mode 0600, not a symlink, in a directory that is ours.
func openHistory(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	st, err := f.Stat()
	if err == nil {
		sys, _ := st.Sys().(*syscall.Stat_t)
		switch {
		case !st.Mode().IsRegular():
			err = errors.New("not a regular file")
		case st.Mode().Perm()&0o077 != 0:
			err = fmt.Errorf("mode %04o lets others read it (chmod 600 %s)", st.Mode().Perm(), path)
		case sys != nil && int(sys.Uid) != os.Geteuid():
			err = fmt.Errorf("it belongs to uid %d", sys.Uid)
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	return f, nil
}

// ReadLine implements repl.LineReader. A paste of several lines comes back
// whole after the line typed before it, blank lines and all, shown with
// continuation prompts: the REPL runs it as one block.
func (e *lineEditor) ReadLine(prompt string) (string, error) {
	e.rl.SetPrompt(prompt)
	// Bracketed paste only while a line is edited: a program a cell runs
	// gets the terminal as it was.
	io.WriteString(e.out, pasteOn)
	line, err := e.rl.Readline()
	io.WriteString(e.out, pasteOff)
	pasted, tooLong := e.paste.taken()
	switch {
	case errors.Is(err, readline.ErrInterrupt):
		return "", repl.ErrLineInterrupted
	case err != nil:
		return "", err
	case tooLong > 0:
		fmt.Fprintf(e.out, "kerneldeck: a paste of over %d bytes was dropped (at most %d are taken); run a large file with exec(open(PATH).read())\n", tooLong, maxPaste)
	case pasted != "":
		lines := strings.Split(pasted, "\n")
		for i, l := range lines {
			lines[i] = typedText(l)
			fmt.Fprintf(e.out, "%s%s\n", repl.PromptMore, lines[i])
		}
		return typedText(line) + strings.Join(lines, "\n"), nil
	}
	line = typedText(line)
	if strings.TrimSpace(line) != "" {
		e.rl.SaveHistory(line)
		if e.hist != nil {
			fmt.Fprintln(e.hist, strconv.Quote(line))
		}
	}
	return line, nil
}

// typedText is what the editor did not take as a key: no control byte (an
// escape sequence it did not know) reaches the kernel.
func typedText(line string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 && r != '\t' || r == 0x7f {
			return -1
		}
		return r
	}, line)
}

// ReadInput implements repl.InputReader: the answer to a cell's input(),
// kept out of the history and not completed; a password is typed unseen.
func (e *lineEditor) ReadInput(prompt string, password bool) (string, error) {
	var line string
	var err error
	if password {
		var b []byte
		b, err = e.rl.ReadPassword(prompt)
		line = string(b)
	} else {
		e.tab.off = true
		e.rl.SetPrompt(prompt)
		line, err = e.rl.Readline()
		e.tab.off = false
	}
	switch {
	case errors.Is(err, readline.ErrInterrupt):
		return "", repl.ErrLineInterrupted
	case err != nil:
		return "", err
	}
	return typedText(line), nil
}

// Close gives the terminal back.
// readline reads on after ctrl+d, and its Close waits for that read, which
// a terminal in blocking mode ends only with the next key: the paste
// reader's own Close ends it first.
func (e *lineEditor) Close() {
	e.paste.Close()
	e.rl.Close()
	if e.hist != nil {
		e.hist.Close()
	}
}
