package cli

import (
	"bytes"
	"io"
	"strings"
	"sync"
)

// The terminal's bracketed paste: on, it wraps pasted text in pasteStart
// and pasteEnd, so pasted newlines are not Enter presses.
const (
	pasteOn    = "\x1b[?2004h"
	pasteOff   = "\x1b[?2004l"
	pasteStart = "\x1b[200~"
	pasteEnd   = "\x1b[201~"
)

// maxPaste bounds one paste kept for a cell.
const maxPaste = 4 << 20

// pasteReader sits between the terminal and the line editor, which knows
// no bracketed paste. A paste of one line passes on as typed text; a paste
// of several is taken out of the key stream (its blank lines would end a
// block) and ends the line being edited instead, for ReadLine to return
// with the paste after it.
type pasteReader struct {
	in io.Reader

	raw     []byte // read, not yet looked at
	out     []byte // for the editor
	inPaste bool
	paste   []byte

	mu      sync.Mutex
	pasted  string // a paste of several lines, for take
	tooLong int    // the size of a paste dropped for its size
}

func newPasteReader(in io.Reader) *pasteReader { return &pasteReader{in: in} }

// Read gives the editor the keys, without the pastes taken out. It reads
// on while all it holds may be the start of a marker (a lone ESC waits for
// the next key, which the editor would also read as one with it).
func (p *pasteReader) Read(b []byte) (int, error) {
	var chunk [4096]byte
	for len(p.out) == 0 {
		n, err := p.in.Read(chunk[:])
		p.raw = append(p.raw, chunk[:n]...)
		p.scan()
		if err != nil && len(p.out) == 0 {
			return 0, err
		}
	}
	n := copy(b, p.out)
	p.out = p.out[n:]
	return n, nil
}

// Close ends a pending read (the terminal's reader is cancelable).
func (p *pasteReader) Close() error {
	if c, ok := p.in.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// scan moves what raw holds to out or to the paste, keeping back only a
// tail that may be the start of a marker.
func (p *pasteReader) scan() {
	for len(p.raw) > 0 {
		marker := pasteStart
		if p.inPaste {
			marker = pasteEnd
		}
		i := bytes.Index(p.raw, []byte(marker))
		if i < 0 {
			keep := markerPrefix(p.raw, marker)
			p.take(p.raw[:len(p.raw)-keep])
			p.raw = p.raw[len(p.raw)-keep:]
			return
		}
		p.take(p.raw[:i])
		p.raw = p.raw[i+len(marker):]
		if p.inPaste {
			p.endPaste()
		}
		p.inPaste = !p.inPaste
	}
}

// take passes b on: to the editor, or to the paste being read.
func (p *pasteReader) take(b []byte) {
	if !p.inPaste {
		p.out = append(p.out, b...)
		return
	}
	if len(p.paste)+len(b) > maxPaste {
		p.mu.Lock()
		p.tooLong = max(p.tooLong, len(p.paste)+len(b))
		p.mu.Unlock()
		return
	}
	p.paste = append(p.paste, b...)
}

func (p *pasteReader) endPaste() {
	text := strings.ReplaceAll(strings.ReplaceAll(string(p.paste), "\r\n", "\n"), "\r", "\n")
	p.paste = p.paste[:0]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tooLong > 0 {
		p.out = append(p.out, '\r')
		return
	}
	if !strings.Contains(strings.TrimRight(text, "\n"), "\n") {
		p.out = append(p.out, strings.TrimRight(text, "\n")...) // one line: as if typed
		return
	}
	p.pasted = strings.TrimRight(text, "\n")
	p.out = append(p.out, '\r')
}

// taken returns the paste of several lines that ended the last line, or
// the size of one dropped for its size, and forgets it.
func (p *pasteReader) taken() (pasted string, tooLong int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pasted, tooLong = p.pasted, p.tooLong
	p.pasted, p.tooLong = "", 0
	return pasted, tooLong
}

// markerPrefix is the length of the longest tail of b that begins marker.
func markerPrefix(b []byte, marker string) int {
	for n := min(len(b), len(marker)-1); n > 0; n-- {
		if bytes.Equal(b[len(b)-n:], []byte(marker[:n])) {
			return n
		}
	}
	return 0
}
