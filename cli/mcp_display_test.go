package cli

import (
	"bytes"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPDisplays: an agent asked to plot gets the picture back over MCP as
// ImageContent, and a DataFrame as text; the structured result lists them.
func TestMCPDisplays(t *testing.T) {
	if exec.Command("/usr/bin/python3", "-c", "import matplotlib, pandas").Run() != nil {
		if os.Getenv("KERNELDECK_REQUIRE_DISPLAY_LIBS") == "1" {
			t.Fatal("/usr/bin/python3 lacks matplotlib or pandas: apt-get install python3-matplotlib python3-pandas")
		}
		t.Skip("/usr/bin/python3 lacks matplotlib or pandas")
	}
	bin := buildBinary(t)
	isolate(t)
	pydir := t.TempDir()
	if err := os.Symlink("/usr/bin/python3", filepath.Join(pydir, "python3")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+pydir+string(os.PathListSeparator)+os.Getenv("PATH"))
	mc := startMCP(t, bin, env, "alice", "", nil)
	res, out := mc.must("python_exec", map[string]any{"code": "import matplotlib.pyplot as plt\nimport pandas as pd\n" +
		"plt.figure(figsize=(4, 3), dpi=50)\nplt.bar(['jan', 'feb'], [3, 5])\nplt.show()\npd.DataFrame({'sales': [3, 5]})"})
	var img *mcp.ImageContent
	texts := ""
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.ImageContent:
			img = c
		case *mcp.TextContent:
			texts += c.Text + "\n"
		}
	}
	if img == nil || img.MIMEType != "image/png" {
		t.Fatalf("no PNG image content in %+v", res.Content)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(img.Data))
	if err != nil || cfg.Width != 200 || cfg.Height != 150 {
		t.Fatalf("the image: %dx%d %v, want 200x150", cfg.Width, cfg.Height, err)
	}
	if !strings.Contains(texts, "[display 2, text/html]") || !strings.Contains(texts, "<table") || !strings.Contains(texts, "2 displays follow") {
		t.Errorf("text content:\n%s", texts)
	}
	ds, _ := out["displays"].([]any)
	if len(ds) != 2 {
		t.Fatalf("structured displays: %v", out["displays"])
	}
}
