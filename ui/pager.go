package ui

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"

	tea "github.com/charmbracelet/bubbletea"
)

// pageReadyMsg brings the selected cell's whole output, written to a
// private file, for the pager.
type pageReadyMsg struct {
	path string
	seq  int
	err  error
}

// pagedMsg is the pager's end.
type pagedMsg struct {
	path string
	err  error
}

// maxPaged bounds what v reads of each spill file (the runner keeps at
// most 5 MiB of a stream).
const maxPaged = 16 << 20

// pageSelected writes the selected cell's whole output (its spill files
// where it was clipped) to a private file, made safe for the terminal: the
// pager shows the kernel's escapes, it does not obey them.
func (p *OutputPane) pageSelected() tea.Cmd {
	r := p.selected()
	if r == nil {
		return func() tea.Msg { return actionDoneMsg{what: "nothing to page: no cell ran in this target yet"} }
	}
	seq, code := r.seq, r.code
	var streams [3]pagedStream
	if r.res == nil {
		streams[0].text, streams[1].text = r.stdout.String(), r.stderr.String()
	} else {
		streams = [3]pagedStream{
			{text: r.res.Stdout, spill: r.res.SpillPath},
			{text: r.res.Stderr, spill: r.res.StderrSpillPath},
			{text: r.res.Traceback},
		}
	}
	return func() tea.Msg {
		path, err := writePaged(seq, code, streams)
		return pageReadyMsg{path: path, seq: seq, err: err}
	}
}

// pagedStream is one stream of a paged cell: its text in the result, and
// the file with all of it when it was clipped.
type pagedStream struct{ text, spill string }

func writePaged(seq int, code string, streams [3]pagedStream) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "[%d] %s\n\n", seq, code)
	for _, s := range streams {
		text := s.text
		if s.spill != "" {
			// The spill is the engine's (or the runner's, on this machine)
			// file of this cell: where it cannot be read, the result's head
			// and tail are what there is, and it says so.
			whole, err := readPrefix(s.spill, maxPaged)
			if err != nil {
				text += fmt.Sprintf("\n[the whole output is not readable here: %v]\n", err)
			} else {
				text = whole
			}
		}
		b.WriteString(text)
	}
	f, err := os.CreateTemp("", "kerneldeck-output-*.txt") // 0600
	if err != nil {
		return "", fmt.Errorf("a file for the pager: %w", err)
	}
	_, werr := f.WriteString(output(b.String()))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("a file for the pager: %w", werr)
	}
	return f.Name(), nil
}

// readPrefix reads up to n bytes of the file at path, never following a
// link at its end.
func readPrefix(path string, n int64) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, n))
	return string(data), err
}

// pagerCmd runs $PAGER (else less) on the paged file, and removes it when
// the pager ends.
func pagerCmd(msg pageReadyMsg) tea.Cmd {
	pager := cmp.Or(os.Getenv("PAGER"), "less")
	args := strings.Fields(pager)
	path := msg.path
	return tea.ExecProcess(exec.Command(args[0], append(args[1:], path)...), func(err error) tea.Msg {
		os.Remove(path)
		if errors.Is(err, exec.ErrNotFound) {
			err = fmt.Errorf("%w; set $PAGER to a pager this machine has", err)
		}
		return pagedMsg{path: path, err: err}
	})
}
