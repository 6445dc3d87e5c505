package enginetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"image/png"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// RequireDisplayLibsEnv, set to 1, makes missing matplotlib, PIL or pandas
// on a host a failure of the display suite instead of a skip.
const RequireDisplayLibsEnv = "KERNELDECK_REQUIRE_DISPLAY_LIBS"

// Displays runs the display-data suite: plots, display() calls, DataFrames,
// _repr_mimebundle_, a spilled large image and hostile display data, each
// through the engine on the Env newEnv gives. The host's python3 needs
// matplotlib, PIL and pandas (Debian's python3-matplotlib, python3-pil,
// python3-pandas).
func Displays(t *testing.T, newEnv func(t *testing.T) backends.Env) {
	t.Helper()
	probe := New(t, newEnv(t), nil)
	if out := probe.Host(`python3 -c 'import matplotlib, PIL, pandas; print("LIBS OK")' 2>&1; true`); !strings.Contains(out, "LIBS OK") {
		if os.Getenv(RequireDisplayLibsEnv) == "1" {
			t.Fatalf("python3 on %s lacks matplotlib, PIL or pandas (%s) and %s=1: apt-get install python3-matplotlib python3-pil python3-pandas",
				probe.Env.URI(), strings.TrimSpace(out), RequireDisplayLibsEnv)
		}
		t.Skipf("python3 on %s lacks matplotlib, PIL or pandas: %s", probe.Env.URI(), strings.TrimSpace(out))
	}
	run := func(t *testing.T, code string) *engine.Result {
		t.Helper()
		h := New(t, newEnv(t), nil)
		res := h.Run("d", code, 0)
		if res.Status != engine.StatusSuccess {
			t.Fatalf("cell: status %s stderr %q traceback %q", res.Status, res.Stderr, res.Traceback)
		}
		return res
	}
	t.Run("PlotIsAPNGOfTheFiguresSize", func(t *testing.T) {
		res := run(t, "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=100)\nplt.plot([1, 3, 2])\nplt.show()")
		if len(res.Displays) != 1 || res.Stderr != "" {
			t.Fatalf("displays %d, stderr %q; want one figure and no warning", len(res.Displays), res.Stderr)
		}
		raw, err := base64.StdEncoding.DecodeString(res.Displays[0].Data["image/png"])
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(raw))
		if err != nil || cfg.Width != 300 || cfg.Height != 200 {
			t.Fatalf("the PNG: %dx%d, %v; want 300x200", cfg.Width, cfg.Height, err)
		}
		if !strings.HasPrefix(res.Displays[0].Data["text/plain"], "<Figure size 300x200") {
			t.Errorf("text/plain %q", res.Displays[0].Data["text/plain"])
		}
	})
	t.Run("DisplaysInOrder", func(t *testing.T) {
		res := run(t, "class R:\n    def _repr_html_(self):\n        return '<b>r</b>'\n    def __repr__(self):\n        return 'R()'\n"+
			"display('first')\ndisplay(2)\nR()")
		var got []string
		for _, d := range res.Displays {
			got = append(got, d.Data["text/plain"]+"|"+d.Data["text/html"])
		}
		if strings.Join(got, ",") != "'first'|,2|,R()|<b>r</b>" || res.Stdout != "R()\n" {
			t.Fatalf("displays %q, stdout %q", got, res.Stdout)
		}
	})
	t.Run("DataFrameIsHTMLAndText", func(t *testing.T) {
		res := run(t, "import pandas as pd\npd.DataFrame({'month': ['jan', 'feb'], 'sales': [3, 5]})")
		if len(res.Displays) != 1 || !strings.Contains(res.Displays[0].Data["text/html"], "<table") ||
			!strings.Contains(res.Displays[0].Data["text/plain"], "sales") {
			t.Fatalf("displays %+v", res.Displays)
		}
	})
	t.Run("MimeBundleIsHonoured", func(t *testing.T) {
		res := run(t, "class M:\n    def _repr_mimebundle_(self, include=None, exclude=None):\n"+
			"        return {'text/markdown': '**bold**', 'application/json': {'a': 1}}, {'text/markdown': {'isolated': True}}\n"+
			"    def __repr__(self):\n        return 'M()'\ndisplay(M())")
		if len(res.Displays) != 1 {
			t.Fatalf("displays %+v", res.Displays)
		}
		d := res.Displays[0]
		if d.Data["text/markdown"] != "**bold**" || d.Data["application/json"] != `{"a": 1}` || d.Data["text/plain"] != "M()" ||
			!strings.Contains(string(d.Metadata), "isolated") {
			t.Fatalf("display %+v", d)
		}
	})
	t.Run("LargeImageSpillsWhole", func(t *testing.T) {
		res := run(t, "import os, hashlib\nblob = os.urandom(6 << 20)\nclass Big:\n    def _repr_png_(self):\n        return blob\n"+
			"display(Big())\nprint(hashlib.sha256(blob).hexdigest())")
		if len(res.Displays) != 1 {
			t.Fatalf("displays %+v", res.Displays)
		}
		d := res.Displays[0]
		path := d.Spill["image/png"]
		if _, inline := d.Data["image/png"]; inline || path == "" {
			t.Fatalf("a 6 MB image: data keys %v, spill %v, note %q", keys(d.Data), d.Spill, d.Note)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("spill file %s: %v %v, want mode 0600", path, fi, err)
		}
		data, _ := os.ReadFile(path)
		sum := sha256.Sum256(data)
		if hex.EncodeToString(sum[:]) != strings.TrimSpace(res.Stdout) {
			t.Fatalf("the spill file (%d bytes) is not the image the kernel made", len(data))
		}
	})
	t.Run("HostileDisplayData", func(t *testing.T) {
		res := run(t, "class Bad:\n    def _repr_png_(self):\n        return 'not base64!!'\n    def _repr_html_(self):\n        raise ValueError('no')\n"+
			"display(Bad())\nfor i in range(150):\n    display(i)")
		if len(res.Displays) != 100 || !strings.Contains(res.DisplayNote, "51 more displays dropped") {
			t.Fatalf("%d displays, note %q; want 100 and the 51 dropped said", len(res.Displays), res.DisplayNote)
		}
		bad := res.Displays[0]
		if _, ok := bad.Data["image/png"]; ok || !strings.Contains(bad.Note, "_repr_png_") || !strings.Contains(bad.Note, "_repr_html_ failed: ValueError") {
			t.Fatalf("the bad display: %+v", bad)
		}
	})
	t.Run("TrivialCellHasNoDisplays", func(t *testing.T) {
		if res := run(t, "6 * 7"); len(res.Displays) != 0 || res.Stdout != "42\n" {
			t.Fatalf("6 * 7: displays %+v stdout %q", res.Displays, res.Stdout)
		}
	})
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// StreamsDisplays checks that a display reaches OnDisplay when the cell
// makes it, after the output printed before it, and not only with the
// result: the cell waits, after plotting, for a file that the test writes
// only once the plot has arrived (fast path only; matplotlib as Displays).
func StreamsDisplays(t *testing.T, env backends.Env) {
	t.Helper()
	h := New(t, env, nil)
	first := h.Run("d", "import matplotlib.pyplot as plt, os, time", 0)
	flag := first.Kernel.Dir + "/plot-arrived"
	var mu sync.Mutex
	var seq []string
	arrived := make(chan struct{}, 1)
	go func() {
		if _, ok := <-arrived; ok {
			h.Host("touch " + flag)
		}
	}()
	code := "print('before', flush=True)\nplt.figure(figsize=(3, 2), dpi=100)\nplt.plot([1, 3, 2])\nplt.show()\n" +
		"for _ in range(2000):\n    if os.path.exists(" + pyQuote(flag) + "):\n        break\n    time.sleep(0.005)\n" +
		"print('released' if os.path.exists(" + pyQuote(flag) + ") else 'never released')"
	res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "d", Code: code,
		OnOutput: func(stream, text string) {
			mu.Lock()
			defer mu.Unlock()
			// Output comes in chunks as the runner finds it (print's text
			// and its newline may be two): a stream's run is one entry.
			if n := len(seq); n > 0 && strings.HasPrefix(seq[n-1], stream+":") {
				seq[n-1] += text
				return
			}
			seq = append(seq, stream+":"+text)
		},
		OnDisplay: func(d engine.Display) {
			mu.Lock()
			defer mu.Unlock()
			seq = append(seq, "display:"+d.Label())
			select {
			case arrived <- struct{}{}:
			default:
			}
		}})
	close(arrived)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "before\nreleased\n" || len(res.Displays) != 1 {
		t.Fatalf("stdout %q, %d displays in the result: the plot did not stream while the cell ran", res.Stdout, len(res.Displays))
	}
	mu.Lock()
	defer mu.Unlock()
	want := "stdout:before\n,display:[image/png 300×200, "
	if got := strings.Join(seq, ","); !strings.HasPrefix(got, want) || strings.Count(got, "display:") != 1 {
		t.Fatalf("streamed %q, want it to start %q and hold one display", got, want)
	}
}

// pyQuote is s as a Python string literal.
func pyQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
