package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// journalKernels reads the kernel ids in dir's journals, checking that each
// journal and the dir are private.
func journalKernels(t *testing.T, dir string) []string {
	t.Helper()
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("journal dir %s: %v %v, want mode 0700", dir, st.Mode(), err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "engine-*.json"))
	var ids []string
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			continue // rewritten meanwhile
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("journal %s has mode %v, want 0600 (it holds the kernels' secrets)", f, st.Mode())
		}
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var sealed struct{ Body json.RawMessage }
		var j struct {
			Kernels []struct {
				ID    string
				Token string
				Spare bool
				PID   int
			}
		}
		if err := json.Unmarshal(data, &sealed); err != nil || json.Unmarshal(sealed.Body, &j) != nil {
			t.Fatalf("journal %s: %v %s", f, err, data)
		}
		for _, k := range j.Kernels {
			if k.Token == "" && !(k.Spare && k.PID == 0) { // a spare still starting has none yet
				t.Fatalf("journal %s: kernel %s without its secret: no engine could take it back", f, k.ID)
			}
			if !k.Spare {
				ids = append(ids, k.ID)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

func waitJournal(t *testing.T, dir string, want []string) {
	t.Helper()
	slices.Sort(want)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := journalKernels(t, dir)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("journal holds %v, want %v", got, want)
		}
	}
}

// While an engine runs, its journal holds every kernel it has, as kernels
// come and go; a clean close removes it.
func TestTheJournalFollowsTheKernels(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	t.Cleanup(func() { // after the rig's engine closed
		if left, _ := filepath.Glob(filepath.Join(dir, "engine-*")); len(left) != 0 {
			t.Errorf("a closed engine left its journal: %v", left)
		}
	})
	r := newRig(t, func(c *engine.Config) { c.JournalDir = dir })
	a := r.exec(engine.Request{Owner: "a", Code: "x = 1"})
	b := r.exec(engine.Request{Owner: "b", Code: "x = 2"})
	waitJournal(t, dir, []string{a.Kernel.ID, b.Kernel.ID})
	if err := r.eng.Kill(context.Background(), a.Kernel.ID); err != nil {
		t.Fatal(err)
	}
	waitJournal(t, dir, []string{b.Kernel.ID})
	if locks, _ := filepath.Glob(filepath.Join(dir, "engine-*.lock")); len(locks) != 1 {
		t.Fatalf("lock files %v, want the engine's one", locks)
	}
}

// An engine takes back nothing of an engine that still runs on the same
// dir (its lock is held), and says nothing is waiting.
func TestTakeBackLeavesALiveEngineAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	first := newRig(t, func(c *engine.Config) { c.JournalDir = dir })
	k := first.exec(engine.Request{Owner: "a", Code: "x = 1"})
	waitJournal(t, dir, []string{k.Kernel.ID})
	// The second engine on the same host, closed before the first (the
	// rig checks for goroutines left once its engine closed).
	cfg := first.cfg
	cfg.StateDir = t.TempDir()
	second, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close(context.Background(), false)
	if n, err := second.Orphaned(); n != 0 || err != nil {
		t.Fatalf("Orphaned: %d, %v; want 0 (the first engine lives)", n, err)
	}
	tb, err := second.TakeBack(context.Background())
	if err != nil || tb.Kernels != 0 || len(tb.Failed) != 0 || len(second.Kernels()) != 0 {
		t.Fatalf("TakeBack from a live engine: %+v, %v, kernels %v", tb, err, second.Kernels())
	}
	waitJournal(t, dir, []string{k.Kernel.ID})
}

// A journal others could have written is not believed: its kernels are not
// taken back (their secrets may be known), and the error says why.
func TestALooseJournalIsRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "engine-1-dead.lock"), nil, 0o600)
	loose := filepath.Join(dir, "engine-1-dead.json")
	os.WriteFile(loose, []byte(`{"pid":1,"kernels":[{"id":"k1","owner":"a","task":"default","backend":"fake","pid":5,"dir":"/tmp/x/k1","token":"t"}]}`), 0o644)
	os.Chmod(loose, 0o644)
	r := newRig(t, func(c *engine.Config) { c.JournalDir = dir })
	tb, err := r.eng.TakeBack(context.Background())
	if err == nil || !strings.Contains(err.Error(), "mode 0600") || tb.Kernels != 0 || len(r.eng.Kernels()) != 0 {
		t.Fatalf("TakeBack of a loose journal: %+v, %v", tb, err)
	}
}

// A spare still starting when its engine died (SIGKILL mid-spawn) is in the
// journal by its id alone; the next engine finds its processes by that id
// and kills them.
func TestAStartingSpareOfADeadEngineIsKilled(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := enginetest.ShortTempDir(t)
	const id = "k0123456789ab"
	kd := filepath.Join(tmp, "kerneldeck-"+currentLogin(t), id)
	if err := os.MkdirAll(kd, 0o700); err != nil {
		t.Fatal(err)
	}
	// What the spawn had started: a process whose argv names the runner.
	runner := exec.Command("/usr/bin/python3", "-c", "import time; time.sleep(120)", filepath.Join(kd, "runner.py"))
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- runner.Wait() }()
	t.Cleanup(func() { runner.Process.Kill() })
	// The dead engine's journal and its lock, which nobody holds.
	dead := "engine-999999-abcd1234"
	if err := os.WriteFile(filepath.Join(dir, dead+".lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	journal, err := engine.SealJournal(dir, []byte(`{"pid":999999,"started":"2026-01-01T00:00:00Z","kernels":[{"id":"`+id+`","backend":"local","spare":true}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, dead+".json"), journal, 0o600); err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(tmp)}, StateDir: t.TempDir(), JournalDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(context.Background(), false)
	tb, err := eng.TakeBack(context.Background())
	if err != nil || tb.SparesKilled != 1 {
		t.Fatalf("TakeBack: %+v, %v; want the starting spare killed", tb, err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the starting spare's runner still runs after the take-back")
	}
	if _, err := os.Stat(kd); !os.IsNotExist(err) {
		t.Errorf("its kernel dir is still there: %v", err)
	}
}

func currentLogin(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

// A journal is believed only when an engine of the state dir sealed it:
// one that another process of the login planted, naming a victim process
// (another user's, where the test runs as root) and a victim dir, makes
// the next engine kill and remove nothing, and it is reported and left
// where it is. A sealed journal that names them anyway (an engine's own
// mistake, or a pid reused since) kills only a process that is a runner
// of the dir it names, and removes only dirs under a kernel root.
func TestAPlantedJournalKillsAndRemovesNothing(t *testing.T) {
	tmp := enginetest.ShortTempDir(t)
	victimDir := filepath.Join(t.TempDir(), "victim")
	if err := os.MkdirAll(victimDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victimDir, "precious"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	shaped := filepath.Join(tmp, "kerneldeck-"+currentLogin(t), "k0123456789ab")
	if err := os.MkdirAll(shaped, 0o700); err != nil {
		t.Fatal(err)
	}
	victim := exec.Command("sleep", "120")
	if os.Geteuid() == 0 {
		victim = exec.Command("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "120")
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed, it would stay a zombie of this process: kill(pid, 0) would
	// still find it. Its Wait tells.
	gone := make(chan struct{})
	go func() { victim.Wait(); close(gone) }()
	t.Cleanup(func() { victim.Process.Kill(); <-gone })
	pid := victim.Process.Pid
	body := fmt.Sprintf(`{"pid":999999,"started":"2026-01-01T00:00:00Z","kernels":[`+
		`{"id":"k0123456789aa","backend":"local","spare":true,"pid":%[1]d,"dir":%[2]q},`+
		`{"id":"k0123456789ab","backend":"local","spare":true,"pid":%[1]d,"dir":%[3]q},`+
		`{"id":"k0123456789ac","owner":"o","task":"t","backend":"local","pid":%[1]d,"dir":%[2]q,"token":"00"}]}`, pid, victimDir, shaped)
	for _, sealed := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "journal")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		data := []byte(body)
		if sealed {
			var err error
			if data, err = engine.SealJournal(dir, data); err != nil {
				t.Fatal(err)
			}
		}
		const dead = "engine-999999-abcd1234"
		os.WriteFile(filepath.Join(dir, dead+".lock"), nil, 0o600)
		if err := os.WriteFile(filepath.Join(dir, dead+".json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(tmp)}, StateDir: t.TempDir(), JournalDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		tb, err := eng.TakeBack(context.Background())
		eng.Close(context.Background(), false)
		if !sealed {
			if err == nil || !strings.Contains(err.Error(), "left alone") || tb.Kernels+tb.SparesKilled+len(tb.Failed) != 0 {
				t.Errorf("TakeBack of a planted journal: %+v, %v; want it reported and left alone", tb, err)
			}
			if _, err := os.Stat(filepath.Join(dir, dead+".json")); err != nil {
				t.Errorf("the planted journal was removed: %v", err)
			}
		}
		select {
		case <-gone:
			t.Fatalf("sealed %v: the victim process was killed", sealed)
		case <-time.After(300 * time.Millisecond):
		}
		if _, err := os.Stat(filepath.Join(victimDir, "precious")); err != nil {
			t.Fatalf("sealed %v: the victim dir was removed: %v", sealed, err)
		}
		if _, err := os.Stat(shaped); (err == nil) == sealed {
			t.Errorf("sealed %v: the kernel-shaped dir: %v; want it removed only for a sealed journal", sealed, err)
		}
	}
}
