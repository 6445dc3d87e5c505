package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// planter is bob's cell: it writes code that would run in every later
// runner of the login, were runners not isolated: csv.py in the cwd (first
// on the path, once), usercustomize.py in the user site dir, and a .pth
// file with an import line in a site-packages dir the login can write.
// Each plant, if it ever runs in a runner (which has KERNELDECK_STDIN in
// its environment at start), leaves a file in the marks dir. It prints the
// paths it wrote, one per line.
const planter = `
import os, site, sys
marks = %q
def mark(name):
    return "import os, sys\nif 'KERNELDECK_STDIN' in os.environ or 'kerneldeck_runtime' in sys.modules: open(os.path.join(%%r, %%r), 'w').write(repr((os.getpid(), sys.argv, sys.flags)))\n" %% (marks, name)
plants = {
    os.path.join(os.getcwd(), "csv.py"): mark("cwd"),
    os.path.join(site.getusersitepackages(), "usercustomize.py"): mark("usercustomize"),
}
dirs = [d for d in site.getsitepackages() if os.access(d, os.W_OK)]
if dirs:
    plants[os.path.join(dirs[0], "kdplant-%%d.pth" %% os.getpid())] = "import os; exec(%%r)\n" %% mark("pth")
for path, code in plants.items():
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(code)
    print(path)
`

// No code another kernel of the login can write runs in a runner: not a
// module in the cwd that shadows the standard library, not the user site's
// usercustomize, not a .pth line in a site dir the login can write, in a
// new kernel or in a spare started after the plant; with Landlock and
// without.
func TestPlantedCodeNeverRunsInARunner(t *testing.T) {
	for _, confine := range []bool{true, false} {
		t.Run(fmt.Sprintf("confine=%v", confine), func(t *testing.T) {
			cwd := t.TempDir()
			t.Chdir(cwd) // the kernels' cwd, shared by the login's kernels
			marks := t.TempDir()
			os.Chmod(marks, 0o777)
			root := t.TempDir()
			eng, err := engine.New(engine.Config{
				Backends:     []backends.Env{backends.NewLocal(root)},
				StateDir:     t.TempDir(),
				NoConfine:    !confine,
				SpareKernels: map[string]int{"local": 1},
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			t.Cleanup(func() {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				eng.Close(cctx, false)
			})
			bob, err := eng.Execute(ctx, engine.Request{Owner: "bob", Code: fmt.Sprintf(planter, marks)})
			if err != nil || bob.Status != engine.StatusSuccess {
				t.Fatalf("bob's planting cell: %+v %v", bob, err)
			}
			planted := strings.Fields(bob.Stdout)
			t.Cleanup(func() {
				for _, p := range planted {
					os.Remove(p)
				}
			})
			if len(planted) < 2 {
				t.Fatalf("bob planted %q, want at least the cwd and the user site", planted)
			}
			// carol takes the spare started before the plant; alice takes
			// one started after it.
			if r, err := eng.Execute(ctx, engine.Request{Owner: "carol", Code: "1"}); err != nil || r.Status != engine.StatusSuccess {
				t.Fatalf("carol: %+v %v", r, err)
			}
			for deadline := time.Now().Add(30 * time.Second); eng.Spares() == 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no spare was started after the plant")
				}
			}
			alice, err := eng.Execute(ctx, engine.Request{Owner: "alice", Code: "import csv, sys\nprint(csv.__file__)\nprint(sys.path.index('') == len(sys.path) - 1)"})
			if err != nil || alice.Status != engine.StatusSuccess {
				t.Fatalf("alice: %+v %v", alice, err)
			}
			lines := strings.Split(strings.TrimSpace(alice.Stdout), "\n")
			if len(lines) != 2 || strings.HasPrefix(lines[0], cwd) || !strings.HasSuffix(lines[0], "csv.py") || lines[1] != "True" {
				t.Errorf("alice's csv and path: %q, want the standard library's csv and the cwd last", alice.Stdout)
			}
			// The owner's own modules in the cwd still import.
			own, err := eng.Execute(ctx, engine.Request{Owner: "alice", Code: "open('alices_helper.py', 'w').write('X = 7\\n')\nimport alices_helper\nprint(alices_helper.X)"})
			if err != nil || own.Stdout != "7\n" {
				t.Errorf("alice importing her own module from the cwd: %+v %v", own, err)
			}
			fresh, err := eng.Execute(ctx, engine.Request{Owner: "dave", Code: "import csv; print('ran')"})
			if err != nil || fresh.Stdout != "ran\n" {
				t.Fatalf("dave: %+v %v", fresh, err)
			}
			// A mark left by a process of another test (go test runs the
			// packages side by side, and the user site is the login's) is
			// not this engine's: only its runners, under root, count.
			got, _ := os.ReadDir(marks)
			var names []string
			for _, e := range got {
				b, _ := os.ReadFile(filepath.Join(marks, e.Name()))
				t.Logf("%s: %s", e.Name(), b)
				if strings.Contains(string(b), root) {
					names = append(names, e.Name())
				}
			}
			if len(names) != 0 {
				t.Errorf("planted code ran in a runner: marks %v", names)
			}
		})
	}
}
