package engine

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine/runner"
)

// The host-side half of the protocol: each function returns one bash script
// that runs as a single backend command. Scripts carry paths, ids and sizes
// only; every payload (runner source, the config with the kernel's secret,
// cell code) arrives on stdin. Lines the engine reads start with "KD:"; anything else a
// host prints (warnings, shell noise) is kept only for error messages.

// aliveFn defines alive PID: the process exists and is not a zombie (a killed
// runner stays a zombie until its adopter reaps it, and some container inits
// never do). Builtins only; hosts without /proc fall back to kill -0.
const aliveFn = `alive() { kill -0 "$1" 2>/dev/null || return 1; [ -r "/proc/$1/stat" ] || return 0; local s; read -r s <"/proc/$1/stat" || return 0; s=${s##*) }; [ "${s%% *}" != Z ]; }`

// shq quotes s for bash.
var shq = backends.ShellQuote

// spawnScript makes the kernel dir and starts the runner detached in it,
// in one round trip. stdin holds runner.Bootstrap, then runner.py (source,
// or runner.Loader), the compiled runner (may be empty), kerneldeck_tools.py
// and the config line with the kernel's secret, in that order (sizes: the
// three after the bootstrap), and is all the runner's own: the interpreter
// starts with runner.StartProgram, and the bootstrap makes the kernel dir
// and writes runner.py, the runner its private dirs, FIFOs and
// kerneldeck_tools.py, checking every mode. The external commands the
// script ran for those (mkdir, stat, head, mkfifo) were a fork and an exec
// each, 5-7 ms apiece on a small host. The
// code and the secret never touch a file. It prints "KD:SPAWNED <pid> <dir>
// <python> <confinement>", "KD:NOCODE" (the loader refused the code) or
// "KD:ERR <reason>". python, learnt from an earlier spawn, skips PATH
// wrappers such as pyenv shims, which cost more than the spawn. The
// interpreter starts isolated (-I: no PYTHON* variables, user site dir or
// cwd on the path), without site (-S: the runner does its work, skipping
// code this login can write) and writing no bytecode (-B); root,
// learnt too, skips asking for the login. A transient kernel gets an
// unpredictable dir of its own outside the root (the fallback when the
// root is unusable): mkdir fails on anything planted.
func spawnScript(tempDir, id, python, lookup, want, root string, sizes [3]int, readyTimeoutSec int, transient bool) string {
	// root, learnt from an earlier spawn on this host, saves asking id(1)
	// for the login (a fork and an exec); it is only a shortcut to the same
	// path, checked below like a new one.
	rootSetup := `root=` + shq(root) + `
case $root in "$t"/kerneldeck-*) case ${root#"$t"/kerneldeck-} in ''|*/*) root=;; esac;; *) root=;; esac
if [ -z "$root" ] || [ ! -d "$root" ]; then
  login=$(id -un 2>/dev/null) || login="uid$EUID"
  root="$t/kerneldeck-$login"
fi
kd="$root/"` + shq(id) + `
[ -d "$t" ] || fail "temp dir $t does not exist on this host"
[ -L "$root" ] && fail "kernel root $root is a symbolic link; remove it"
[ -e "$root" ] || mkdir "$root" 2>/dev/null
[ -L "$root" ] && fail "kernel root $root is a symbolic link; remove it"
[ -d "$root" ] || fail "kernel root $root is not a directory and could not be created"
[ -O "$root" ] || fail "kernel root $root is owned by another user; remove it or use another temp dir"`
	if transient {
		rootSetup = `kd="$t/kerneldeck-once-"` + shq(id) + `
root="$kd"
[ -d "$t" ] || fail "temp dir $t does not exist on this host"`
	}
	return fmt.Sprintf(`# kerneldeck:spawn
set -u
export LC_ALL=C
# The login's umask, for the cells of a host's own user (builtins only;
# the runner's own files get explicit modes).
u0=; while read -r k v; do [ "$k" = Umask: ] && { u0=$v; break; }; done 2>/dev/null </proc/$$/status
umask 077
fail() { printf 'KD:ERR %%s\n' "$*"; exit 3; }
py=%[6]s
want=%[10]s
# What PATH gives for the name now (builtins only: no fork on the spawn's
# path); python, learnt through lookup, runs only while PATH still gives
# lookup (a venv activated or left, PATH reordered): else the name does.
found=
case $want in */*) ;; *) IFS=: read -ra pdirs <<<"$PATH:"; for d in "${pdirs[@]}"; do [ -f "${d:-.}/$want" ] && [ -x "${d:-.}/$want" ] && { found=${d:-.}/$want; break; }; done;; esac
lookup=%[11]s
[ -n "$lookup" ] && [ "$found" != "$lookup" ] && py=
[ -n "$py" ] && [ -x "$py" ] || py=$want
command -v "$py" >/dev/null 2>&1 || fail "$py was not found on this host (PATH=$PATH); install Python 3.8 or newer, or give --python the interpreter to use"
t=%[1]s
%[2]s
# The runner's bootstrap makes $kd (mkdir(2), atomically) and the runner
# the rest, checking every mode (the umask makes them 700; a root made by
# hand or a default ACL may not), so that everything below (the watcher's
# rm -rf included) works only in a dir this spawn made. A $kd already
# there (planted, a symlink) fails the spawn here, or, if it came since,
# in the bootstrap: it says NODIR and exits 75, and nobody removes it.
# Once it made $kd, the bootstrap marks it so in <root>/.made-<id>, where
# a confined kernel cannot write: the watcher removes only a marked dir,
# so that a cell's own exit status (75 too) is kept like any other.
[ -e "$kd" ] || [ -L "$kd" ] && fail "cannot create kernel dir $kd (it already exists)"
# The runner's parent, a watcher holding no output channel, keeps its exit
# status in <root>/.exit-<id>, so that its death can be told apart (an exit
# code, a signal). It goes beside the kernel dir, in the owner-only root,
# and the watcher removes the dir after it (a confined runner cannot remove
# its own dir): a dir gone means its status is kept or was already read. A
# per-call kernel's dir sits in the shared temp dir, so its status is not
# kept.
exitf="${kd%%/*}/.exit-${kd##*/}" madef="${kd%%/*}/.made-${kd##*/}"; [ "$root" = "$kd" ] && exitf= madef=
# rmkd removes $kd if this spawn made it (marked; a per-call kernel's dir
# has no mark).
rmkd() { [ -z "$madef" ] || [ -e "$madef" ] || return 0; rm -rf -- "$kd" ${madef:+"$madef"}; }
# A SIGKILL is told apart from the OOM killer by the kernel log (a line
# naming the runner's pid, later than its start) or, where that is not
# readable, by its memory cgroup's oom_kill counter having risen.
# The watcher's stdout is a pipe to this script (fd 5): it says its pid,
# then hands the pipe to the runner as fd 3 and lets go of it, so the
# runner's READY (or why it could not start) comes on a channel nobody
# else holds, and its death before READY is EOF. The runner's fds 1 and 2
# are that pipe too until its bootstrap points them at its runner.log: what
# the interpreter says before that (it cannot start) comes here.
exec 5< <( exec 2>/dev/null
  printf 'W %%s\n' "$BASHPID"
  trap '' HUP
  read -r up _ </proc/uptime; up=${up%%.*}
  KERNELDECK_STDIN='%[3]d %[7]d %[4]d' KERNELDECK_UMASK=$u0 "$py" %[9]s -c %[8]s "$kd/runner.py" <&0 3>&1 2>&1 &
  rp=$!; exec >/dev/null </dev/null
  oomf=; while IFS= read -r l; do case $l in *:memory:*) oomf=/sys/fs/cgroup/memory${l#*:memory:}/memory.oom_control;; 0::*) [ -z "$oomf" ] && oomf=/sys/fs/cgroup${l#0::}/memory.events;; esac; done <"/proc/$rp/cgroup"
  # Builtins only, no $(...): a subshell is a fork while the runner starts.
  oomn() { local k v; n=; while read -r k v; do [ "$k" = oom_kill ] && { n=$v; return; }; done <"$oomf"; }
  oomn; oom0=$n
  wait "$rp"; st=$?; why=
  # Not this spawn's $kd (already there): unmarked, or, for a per-call
  # kernel (no mark in the shared temp dir), the bootstrap's 75.
  if [ -n "$madef" ]; then [ -e "$madef" ] || exit 0; else [ "$st" = 75 ] && exit 0; fi
  if [ "$st" = 137 ]; then
    l=$(dmesg | grep -E "[Kk]illed process $rp " | tail -n 1); t=${l#*[}; t=${t%%%%]*}; t=${t// /}; t=${t%%%%.*}
    if [[ $t =~ ^[0-9]+$ && $up =~ ^[0-9]+$ ]] && [ "$t" -ge "$up" ]; then case $l in *"emory cgroup"*) why=oom-cgroup;; *) why=oom-host;; esac
    else oomn; [[ $n =~ ^[0-9]+$ && $oom0 =~ ^[0-9]+$ ]] && [ "$n" -gt "$oom0" ] && why=oom-counter; fi
  fi
  # The cells the runner took over the Execute door (each marked before
  # any of its code ran) go with it: the dir is removed next.
  took=took; for f in "$kd"/cells/*.took; do [ -e "$f" ] || continue; f=${f##*/}; took="$took ${f%%.took}"; done
  [ -n "$exitf" ] && { { printf '%%s\n%%s\n' "$st${why:+ $why}" "$took" >"$exitf.tmp" && mv -f -- "$exitf.tmp" "$exitf"; } || rm -f -- "$exitf.tmp"; }
  rmkd )
# ppid_of sets ppid (no $(...): a fork on the spawn's path).
ppid_of() { local s; ppid=; read -r s 2>/dev/null <"/proc/$1/stat" || return 1; s=${s##*) }; set -- $s; ppid=$2; }
watcher=
read -r -t %[5]d -u 5 word watcher && [ "$word" = W ] && [[ $watcher =~ ^[0-9]+$ ]] || { rmkd; fail "the runner's watcher did not start"; }
# Lines before the runner's answer are what the interpreter said before
# its bootstrap ran (a warning, or why it cannot start).
word= log= rc=0 end=$((SECONDS + %[5]d))
while :; do
  left=$((end - SECONDS)); [ "$left" -gt 0 ] || { rc=142; break; }
  word= rpid= exe= conf=
  read -r -t "$left" -u 5 word rpid exe conf; rc=$?
  [ "$rc" = 0 ] || { [ -n "$word" ] && log+="$word $rpid $exe $conf"; break; }
  case $word in READY|NOCODE|FAILED|NODIR) break;; esac
  [ ${#log} -lt 3000 ] && log+="$word $rpid $exe $conf "
done
# A runner that gave no answer (the loop ends with rc 0 only on one): what
# it wrote, read at once, with builtins, as once it has died its watcher
# removes the dir. An answer names its cause itself, and NODIR's dir is not
# this spawn's to read.
[ "$rc" = 0 ] || { lines=(); mapfile -t lines <"$kd/runner.log"; log="$log${lines[*]}"; [ ${#log} -gt 1500 ] && log=${log: -1500}; } 2>/dev/null
if [ "$rc" = 0 ] && [ "$word" = READY ] && [[ $rpid =~ ^[0-9]+$ ]] &&
  { [ ! -r "/proc/$rpid/stat" ] || { ppid_of "$rpid" && [ "$ppid" = "$watcher" ]; }; }; then
  printf 'KD:SPAWNED %%s %%s %%s %%s %%s\n' "$rpid" "$kd" "$exe" "$conf" "$found"
  exit 0
fi
for p in /proc/[0-9]*; do ppid_of "${p#/proc/}" && [ "$ppid" = "$watcher" ] && kill -KILL -- "-${p#/proc/}" "${p#/proc/}" 2>/dev/null; done
kill -KILL "$watcher" 2>/dev/null
# $kd was there before the runner could make it: not this spawn's.
[ "$word" = NODIR ] && fail "${rpid-} ${exe-} ${conf-}"
# The watcher may have kept the status of the runner, which never
# started, before it was killed: once it is gone, nobody keeps it.
wait "$watcher" 2>/dev/null; [ -n "$exitf" ] && rm -f -- "$exitf" "$exitf.tmp"
# The loader refused the code (made by another interpreter version): the
# engine spawns again from source.
[ "$word" = NOCODE ] && { rmkd; echo KD:NOCODE; exit 3; }
# The runner could not set its dir up or write what it was shipped (its
# message names why): it made $kd, marked or not.
[ "$word" = FAILED ] && { rm -rf -- "$kd" ${madef:+"$madef"}; fail "${rpid-} ${exe-} ${conf-}"; }
rmkd
[ "$rc" -gt 128 ] && fail "runner did not start within %[5]ds: $log"
fail "runner exited before it was ready: $log"
`, shq(tempDir), rootSetup, sizes[0], sizes[2], readyTimeoutSec, shq(python), sizes[1], shq(runner.StartProgram()), runner.StartFlags,
		shq(cmp.Or(want, "python3")), shq(lookup))
}

// spawnStdin is a spawn script's stdin: runner.Bootstrap, then runner.py,
// the compiled runner (may be empty), kerneldeck_tools.py and the config
// line, as spawnScript's sizes say.
func spawnStdin(script, code, stubs, config []byte) []byte {
	b := make([]byte, 0, len(runner.Bootstrap)+len(script)+len(code)+len(stubs)+len(config))
	b = append(b, runner.Bootstrap...)
	for _, part := range [][]byte{script, code, stubs, config} {
		b = append(b, part...)
	}
	return b
}

// cellScript publishes a cell (when publish is set and the cell is not yet
// published), or writes tool-call answers (when answers is set: stdin holds
// lines "SEQ JSON"), optionally rings an interrupt, then waits on the host
// for the result for at most windowSec seconds, checking once a second that
// the runner lives. Output: "KD:RESULT <json>", "KD:PENDING", "KD:DEAD"
// (runner gone before the cell was published: safe to respawn), "KD:LOST"
// (runner gone after it was published), "KD:PUBFAIL" (publish failed), or
// tool-call requests: one "KD:RPC <name> <json>" or "KD:RPCBAD <name>
// <reason>" per request file (each file is removed once printed), then
// "KD:RPCWAIT".
//
// interruptMAC is the MAC the runner wants on the interrupt line.
func cellScript(dir, cellID string, pid, windowSec int, publish, interrupt, answers bool, interruptMAC string) string {
	b2i := map[bool]int{false: 0, true: 1}
	return fmt.Sprintf(`# kerneldeck:cell
export LC_ALL=C
kd=%s; id=%s; pid=%d; w=%d; pub=%d; intr=%d; ans=%d; imac=%s
%s
# died says the runner is gone, with its exit status when its watcher kept
# it (beside the kernel dir; never for a per-call kernel in the shared dir),
# waiting up to a second for the watcher on a busy host; the status is
# read once, then removed.
ef="${kd%%/*}/.exit-${kd##*/}"; case ${kd##*/} in kerneldeck-once-*) ef=;; esac
# "untaken" is KD:DEAD when the runner did not take this cell (its mark,
# or its watcher's list of the marks it found), else KD:LOST.
died() { local st= tk= i m=$1; for ((i = 0; i < 50; i++)); do [ -z "$ef" ] && break; [ -f "$ef" ] && { { read -r st; read -r tk; } <"$ef"; rm -f -- "$ef"; break; }; sleep 0.02; done; [[ $st =~ ^[0-9]+( [a-z-]+)?$ ]] || st=
  if [ "$m" = untaken ]; then m=KD:LOST; case " $tk " in *" $id "*) ;; " took "*) m=KD:DEAD;; esac; fi
  echo "$m${st:+ $st}"; exit 0; }
cd "$kd/cells" 2>/dev/null || died KD:GONE
published=0; [ -e "$id.req" ] || [ -e "$id.took" ] || [ -e "$id.res" ] && published=1
if [ "$pub" = 1 ] && [ "$published" = 0 ]; then
  alive "$pid" || died KD:DEAD
  umask 077
  IFS= read -r -d '' req
  { printf '%%s' "$req" >"$id.req.tmp" && mv -f -- "$id.req.tmp" "$id.req"; } 2>&1 || { rm -f -- "$id.req.tmp"; echo KD:PUBFAIL; exit 0; }
  { exec 3<>../wake && printf 'cell %%s\n' "$id" >&3; } 2>&1 || { rm -f -- "$id.req"; echo KD:PUBFAIL; exit 0; }
elif [ "$pub" = 1 ] && [ ! -e "$id.res" ]; then
  # A retry after a transport error: the earlier attempt may have written
  # the request but died before ringing. The runner runs an id once, so
  # ringing again is always safe.
  exec 3<>../wake && printf 'cell %%s\n' "$id" >&3
fi
if [ "$ans" = 1 ]; then
  exec 3<>../wake || { echo KD:LOST; exit 0; }
  %[12]s
fi
if [ "$intr" = 1 ]; then exec 3<>../wake && printf 'int %%s %%s\n' "$id" "$imac" >&3; fi
exec 4<>../done || { echo KD:LOST; exit 0; }
n=0
while :; do
  if [ -e "$id.res" ]; then IFS= read -r -d '' res <"$id.res"; printf 'KD:RESULT %%s\n' "$res"; exit 0; fi
  if compgen -G '../rpc/*.req' >/dev/null; then
    for f in ../rpc/*.req; do
      nm=${f##*/}; [[ $nm =~ ^[A-Za-z0-9_.-]{1,80}$ ]] || nm='?'
      if [ -f "$f" ] && [ ! -L "$f" ]; then
        data=; IFS= read -r -N %[10]d data <"$f"
        if [ ${#data} -gt %[11]d ]; then printf 'KD:RPCBAD %%s oversized:-more-than-%[11]d-bytes\n' "$nm"
        else data=${data//$'\n'/ }; printf 'KD:RPC %%s %%s\n' "$nm" "${data//$'\r'/ }"; fi
      else printf 'KD:RPCBAD %%s not-a-regular-file\n' "$nm"; fi
      rm -f -- "$f"
    done
    echo KD:RPCWAIT; exit 0
  fi
  # Dead: without its mark of having taken the cell, it never ran here
  # (the runner marks a cell taken, in the dir while it lives, before
  # the cell's code ran), or, once its dir is gone, its watcher's list.
  if ! alive "$pid"; then [ -e "$id.res" ] && continue; [ -e "$id.took" ] && died KD:LOST; [ -d "$kd/cells" ] && died KD:DEAD; died untaken; fi
  [ "$n" -ge "$w" ] && { echo KD:PENDING; exit 0; }
  # A read that times out (status > 128) is one whole second of the window;
  # a byte from the runner wakes us early without using it up.
  IFS= read -r -t 1 -n 1 -u 4 _; [ $? -gt 128 ] && n=$((n + 1))
done
`, shq(dir), shq(cellID), pid, windowSec, b2i[publish], b2i[interrupt], b2i[answers], shq(interruptMAC), aliveFn, maxRPCFile+1, maxRPCFile, answerLoop)
}

// answerLoop writes each tool-call answer on stdin ("SEQ JSON" lines) to
// ../rpc/SEQ.res (0600, tmp + rename) and rings "rpcres SEQ" on fd 3, the
// runner's wake FIFO. The cwd is the kernel's cells dir.
const answerLoop = `umask 077
  while IFS= read -r line; do
    seq=${line%% *}; body=${line#* }
    [[ $seq =~ ^[0-9]{1,18}$ ]] || continue
    printf '%s' "$body" >"../rpc/$seq.res.tmp" && mv -f -- "../rpc/$seq.res.tmp" "../rpc/$seq.res" && printf 'rpcres %s\n' "$seq" >&3
  done`

// answerScript delivers tool-call answers that became ready while a cell
// script was already waiting on the host (a slow tool, an approval).
func answerScript(dir string) string {
	return fmt.Sprintf(`# kerneldeck:answer
export LC_ALL=C
cd %s/cells 2>/dev/null && exec 3<>../wake || { echo KD:GONE; exit 0; }
%s
echo KD:OK
`, shq(dir), answerLoop)
}

// stubsScript gives a spare runner in dir the tool stubs on stdin
// (kerneldeck_tools.py, 0600), when a kernel with tools takes it, and only
// in a kernel dir that is still there and not a link. No cell has run in a
// spare, so nothing reads or has imported the stubs it had; a write that
// fails is KD:GONE, and the engine kills the spare. It prints KD:OK or
// KD:GONE.
func stubsScript(dir string) string {
	return fmt.Sprintf(`# kerneldeck:stubs
export LC_ALL=C
umask 077
kd=%s
[ -d "$kd" ] && [ ! -L "$kd" ] && [ ! -L "$kd/kerneldeck_tools.py" ] || { echo KD:GONE; exit 0; }
cat >"$kd/kerneldeck_tools.py" 2>/dev/null && echo KD:OK || echo KD:GONE
`, shq(dir))
}

// killTarget is one runner a kill script kills.
type killTarget struct {
	dir string
	pid int
}

// killScript kills the runners' process groups, waits (at most 2 s in all)
// until they are gone, and removes their dirs, so that "killed" means no
// process is left; one script kills every runner of a host that goes at
// once (a shutdown of 50 kernels is one session, not a burst of 50). A pid
// is only signalled while its dir exists, so a recycled pid is never hit
// after the runner cleaned up by itself.
func killScript(targets []killTarget) string {
	var b strings.Builder
	b.WriteString("# kerneldeck:kill\n")
	// k kills only a runner of dir $1: the process whose argv names
	// $1/runner.py (its group is its own), so a record that names another
	// process, or a pid reused since, kills nothing. A host without /proc
	// cannot tell, and is trusted.
	b.WriteString(`runs() { local a; [ -d /proc/self ] || return 0; [ -r "/proc/$2/cmdline" ] || return 1; mapfile -d '' -t a <"/proc/$2/cmdline" 2>/dev/null || return 1; for a in "${a[@]}"; do [ "$a" = "$1/runner.py" ] && return 0; done; return 1; }
k() { [ -d "$1" ] && runs "$1" "$2" && kill -KILL -- "-$2" "$2" 2>/dev/null; return 0; }
w() {
  # The runner's watcher keeps its exit status beside the dir and then
  # removes the dir: once the dir is gone, the status can go too.
  if [ -d "$1" ] && [ -p "$1/done" ] && exec 9<>"$1/done"; then
    while [ -d "$1" ] && [ $i -lt 200 ]; do read -t 0.01 -u 9 _; i=$((i + 1)); done
    exec 9<&-
  fi
  rm -rf -- "${1%/*}/.exit-${1##*/}" "${1%/*}/.exit-${1##*/}.tmp" "$1" "${1%/*}/.made-${1##*/}"
}
i=0
`)
	for _, t := range targets {
		fmt.Fprintf(&b, "k %s %d\n", shq(t.dir), t.pid)
	}
	for _, t := range targets {
		fmt.Fprintf(&b, "w %s %d\n", shq(t.dir), t.pid)
	}
	b.WriteString("echo KD:KILLED\n")
	return b.String()
}

// abandonScript kills what a spawn the engine gave up on (a timeout, a cut
// connection, a cancelled call) may still run on the host, and removes its
// kernel dir. The engine never learnt the runner's pid, so everything is
// found by the kernel's id: the runner by its script path in its argv
// (anywhere: an interpreter's shim runs before it), the spawn script and
// its runner's watcher (a forked copy of it) by the script in their argv
// (kill(2) keeps it to the login's own; /proc/<pid> is no guide, as
// the runner makes itself non-dumpable). Several passes, as a shell may
// fork between one's reading of /proc and its kill.
func abandonScript(tempDir, id string) string {
	return fmt.Sprintf(`# kerneldeck:abandon
export LC_ALL=C
t=%[1]s; id=%[2]s
sweep() {
  local p a x
  found=0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    mapfile -d '' a 2>/dev/null <"/proc/$p/cmdline" || continue
    for x in "${a[@]:1}"; do
      case $x in "$t"/kerneldeck-*"$id/runner.py"|"# kerneldeck:spawn"*"'$id'"*) kill -KILL "$p" 2>/dev/null; found=1; break;; esac
    done
  done
}
for i in 1 2 3 4 5; do sweep; [ "$found" = 0 ] && break; done
for d in "$t"/kerneldeck-*/"$id"; do
  [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] && [ ! -L "${d%%/*}" ] && [ -O "${d%%/*}" ] || continue
  rm -rf -- "$d" "${d%%/*}/.exit-$id" "${d%%/*}/.exit-$id.tmp" "${d%%/*}/.made-$id"
done
d="$t/kerneldeck-once-$id"
[ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] && rm -rf -- "$d"
echo KD:KILLED
`, shq(tempDir), shq(id))
}

// ringScript writes one control line ("int ID", "cfg SECONDS") to the
// runner's wake FIFO, using only shell builtins.
func ringScript(dir, line string) string {
	return fmt.Sprintf(`# kerneldeck:ring
if [ -p %[1]s/wake ] && exec 3<>%[1]s/wake; then printf '%%s\n' %[2]s >&3 && echo KD:OK; else echo KD:DEAD; fi
`, shq(dir), shq(line))
}

// adoptScript checks that a kernel left running by an earlier engine is
// still there and still ours: the dir is an owner-only directory and pid is
// alive and runs this dir's runner.py. It prints KD:ADOPT, or KD:GONE with
// the reason.
func adoptScript(dir string, pid int) string {
	return fmt.Sprintf(`# kerneldeck:adopt
export LC_ALL=C
kd=%[1]s; pid=%[2]d
%[3]s
gone() { echo "KD:GONE $*"; exit 0; }
[ -d "$kd" ] && [ ! -L "$kd" ] && [ -O "$kd" ] || gone "the runner has exited: no kernel dir $kd"
# Dead first: once the runner is gone its watcher removes the dir, and the
# checks below would find it half removed.
alive "$pid" || gone "runner $pid has exited"
for d in "$kd" "$kd/cells" "$kd/rpc"; do
  [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] || gone "$d is not an owner-only dir"
  m=$(stat -c %%a -- "$d") && [ "$m" = 700 ] || gone "$d has mode $m, not 700"
done
if [ -r "/proc/$pid/cmdline" ]; then
  mapfile -d '' argv <"/proc/$pid/cmdline"
  # python -c <start program> <dir>/runner.py; an older engine's runner:
  # python <dir>/runner.py.
  [ "${argv[${#argv[@]}-1]-}" = "$kd/runner.py" ] || gone "pid $pid is not this kernel's runner"
fi
echo KD:ADOPT
`, shq(dir), pid, aliveFn)
}

// fetchScript prints at most max bytes of a spill file on the host.
func fetchScript(path string, max int) string {
	return fmt.Sprintf("# kerneldeck:fetch\nhead -c %d -- %s\n", max, shq(path))
}

// compileScript compiles the runner (runner.Source on stdin) with the
// host's interpreter python ("": the python3 on PATH, as a spawn that knows
// none runs), isolated (-I: no environment, no user site, no cwd on the
// path) and without site (-S: nothing of the host's packages runs). It
// prints "KD:CODE <base64>" and "KD:EXE <path>" (runner.CompileProgram) or
// "KD:ERR <reason>".
// resolveScript prints "KD:EXE <path>": the interpreter that python (""
// for python3 on PATH) runs, a shim's own resolved.
func resolveScript(python string) string {
	return fmt.Sprintf(`# kerneldeck:resolve
export LC_ALL=C
py=%s
[ -n "$py" ] || py=python3
case $py in /*) ;; *) py=$(command -v "$py") || { printf 'KD:ERR %%s was not found on PATH\n' "$py"; exit 3; } ;; esac
exec "$py" -I -S -c 'import sys; sys.stdout.write("KD:EXE %%s\n" %% sys.executable)'
`, shq(python))
}

func compileScript(python string) string {
	return fmt.Sprintf(`# kerneldeck:compile
export LC_ALL=C
py=%s
[ -n "$py" ] || py=python3
case $py in /*) ;; *) py=$(command -v "$py") || { printf 'KD:ERR %%s was not found on PATH\n' "$py"; exit 3; } ;; esac
[ -x "$py" ] || { printf 'KD:ERR %%s is not an executable interpreter\n' "$py"; exit 3; }
exec "$py" -I -S -c %s %d
`, shq(python), shq(runner.CompileProgram), len(runner.Source))
}
