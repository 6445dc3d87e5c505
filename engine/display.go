package engine

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	_ "image/gif" // image sizes in labels
	_ "image/jpeg"
	_ "image/png"
	"regexp"
	"slices"
	"strings"
)

// Display is one rich output of a cell, as IPython's display protocol makes
// them: the value of the last expression when it has rich representations,
// and each display(obj) call, in order. Data maps MIME types to the
// representation: text as is, binary (image/png, image/jpeg, image/gif)
// base64-encoded, application/json as JSON text; text/plain is always there.
type Display struct {
	Data     map[string]string `json:"data"`
	Metadata json.RawMessage   `json:"metadata,omitempty"`
	// Spill maps the MIME types too large for the result to a 0600 file on
	// this machine holding the whole value (raw bytes for binary types).
	Spill map[string]string `json:"spill,omitempty"`
	// Note says what was dropped or clipped, and why.
	Note string `json:"note,omitempty"`
}

// Limits on what a runner may send as displays: kernel code controls it.
const (
	maxDisplays       = 100
	maxDisplayMIME    = 16 // representations in one display
	maxDisplayMeta    = 64 << 10
	maxDisplayNote    = 1 << 10
	maxDisplaysResult = 8 << 20 // data bytes in one result (the runner keeps to 5 MB)
	// maxDisplaySpill bounds one spilled representation fetched here (the
	// runner drops larger ones; a command's output is capped at 32 MB).
	maxDisplaySpill = 24 << 20
)

// mimeType is what a display's key must look like.
var mimeType = regexp.MustCompile(`^[a-z]+/[a-zA-Z0-9][a-zA-Z0-9.+-]{0,80}$`)

// binaryMIME are the types carried base64-encoded.
func binaryMIME(m string) bool { return slices.Contains(ImageTypes(), m) }

// runnerDisplay is a display as the runner sends it.
type runnerDisplay struct {
	Data     map[string]string `json:"data"`
	Metadata json.RawMessage   `json:"metadata"`
	Spill    map[string]string `json:"spill"`
	Note     string            `json:"note"`
}

// displaysFromFrame checks a runner's displays and returns those that hold,
// with a note for what was dropped; spilled parts are copied here.
func (e *Engine) displaysFromFrame(ctx context.Context, k *Kernel, f *runnerFrame) ([]Display, string) {
	var out []Display
	var notes []string
	dropped := max(0, f.DisplaysDropped)
	total := 0
	for i, rd := range f.Displays {
		if len(out) >= maxDisplays {
			dropped += len(f.Displays) - i
			break
		}
		if d := e.checkDisplay(ctx, k, f.ID, i, rd, &total); d != nil {
			out = append(out, *d)
		} else {
			notes = append(notes, fmt.Sprintf("display %d dropped: %d representations (at most %d)", i+1, len(rd.Data)+len(rd.Spill), maxDisplayMIME))
		}
	}
	if dropped > 0 {
		notes = append(notes, fmt.Sprintf("%d more displays dropped (at most %d a cell)", dropped, maxDisplays))
	}
	return out, strings.Join(notes, "; ")
}

// checkDisplay is rd as it may be kept (nil when it has too many
// representations to look at), with its dropped parts noted; total counts
// the result's data bytes so far.
func (e *Engine) checkDisplay(ctx context.Context, k *Kernel, cell string, i int, rd runnerDisplay, total *int) *Display {
	if len(rd.Data)+len(rd.Spill) > maxDisplayMIME {
		return nil
	}
	d := &Display{Data: map[string]string{}}
	var why []string
	for mime, v := range rd.Data {
		switch {
		case !mimeType.MatchString(mime):
			why = append(why, fmt.Sprintf("%q is not a MIME type", truncate(mime, 40)))
			continue
		case *total+len(v) > maxDisplaysResult:
			why = append(why, fmt.Sprintf("%s dropped: the result's displays are over %d MB", mime, maxDisplaysResult>>20))
			continue
		case binaryMIME(mime):
			if _, err := base64.StdEncoding.DecodeString(v); err != nil {
				why = append(why, mime+" dropped: not base64")
				continue
			}
		}
		*total += len(v)
		d.Data[mime] = v
	}
	if _, ok := d.Data["text/plain"]; !ok {
		d.Data["text/plain"] = ""
	}
	if len(rd.Metadata) > 0 && len(rd.Metadata) <= maxDisplayMeta && json.Valid(rd.Metadata) {
		d.Metadata = rd.Metadata
	}
	for mime, hostPath := range rd.Spill {
		if !mimeType.MatchString(mime) {
			continue
		}
		if k == nil {
			why = append(why, mime+" is too large for the stream: it comes with the result")
			continue
		}
		ext := mime[strings.IndexByte(mime, '/')+1:]
		if local := e.copySpillMax(ctx, k, hostPath, fmt.Sprintf("%s.display%d.%s", cell, i, safeExt(ext)), maxDisplaySpill); local != "" {
			if d.Spill == nil {
				d.Spill = map[string]string{}
			}
			d.Spill[mime] = local
		} else {
			why = append(why, mime+" was too large and could not be fetched")
		}
	}
	if rd.Note != "" {
		why = append([]string{rd.Note}, why...)
	}
	d.Note = truncate(strings.Join(why, "; "), maxDisplayNote)
	return d
}

// ImageTypes are the image MIME types a display may carry, base64-encoded,
// in the order a viewer prefers them.
func ImageTypes() []string { return []string{"image/png", "image/jpeg", "image/gif"} }

// Label is one line standing for d where it cannot be shown: an image as
// "[image/png 640×480, 23 KB]", anything else as the first line of its
// text/plain (clipped to 200 characters, control characters and all: the
// caller sanitises what it prints).
func (d Display) Label() string {
	for _, m := range ImageTypes() {
		if v, ok := d.Data[m]; ok {
			return ImageLabel(m, v)
		}
		if _, ok := d.Spill[m]; ok {
			return "[" + m + ", too large for the result: saved on this machine]"
		}
	}
	first, _, more := strings.Cut(d.Data["text/plain"], "\n")
	if more || len(first) > 200 {
		first = truncate(first, 200)
		if !strings.HasSuffix(first, "…") {
			first += " …"
		}
	}
	return first
}

// ImageLabel is "[image/png 640×480, 23 KB]" for a base64 image. It
// decodes only the start, where the image's size is (a JPEG's may follow
// tens of KB of metadata): a label is made for every display that streams
// or is shown, and an image may be 5 MB.
func ImageLabel(mime, b64 string) string {
	if len(b64)%4 != 0 {
		return fmt.Sprintf("[%s, not valid base64]", mime)
	}
	raw, err := base64.StdEncoding.DecodeString(b64[:min(len(b64), labelHead)])
	if err != nil {
		return fmt.Sprintf("[%s, not valid base64]", mime)
	}
	n := base64.StdEncoding.DecodedLen(len(b64)) - strings.Count(b64[max(0, len(b64)-2):], "=")
	size := fmt.Sprintf("%d B", n)
	if n >= 1024 {
		size = fmt.Sprintf("%d KB", (n+512)/1024)
	}
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil {
		return fmt.Sprintf("[%s, %s]", mime, size)
	}
	return fmt.Sprintf("[%s %d×%d, %s]", mime, cfg.Width, cfg.Height, size)
}

// labelHead is how much of an image's base64 ImageLabel decodes (a
// multiple of 4).
const labelHead = 64 << 10

var unsafeExt = regexp.MustCompile(`[^a-z0-9]`)

func safeExt(ext string) string {
	ext = unsafeExt.ReplaceAllString(strings.ToLower(strings.SplitN(ext, "+", 2)[0]), "")
	if ext == "" || len(ext) > 10 {
		return "bin"
	}
	return ext
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
