#!/usr/bin/env bash
# Builds a kernel image for docker-image:// from this machine's own Python,
# bash and coreutils, with no registry: docker import of a tree made here.
#
#   examples/kernel-image.sh [TAG]      # default: kerneldeck-python:local
#   kerneldeck --backend docker-image://kerneldeck-python:local
#
# What an image needs for kerneldeck: bash, python3 (3.8 or newer) and the
# coreutils the engine's scripts run (sleep, mkdir, cat, ...) on PATH, a
# writable /tmp; nothing else runs in it. Packages your cells import are
# copied with --site (this machine's dist-packages) or installed in an
# image of your own that starts FROM this one.
set -euo pipefail

tag=kerneldeck-python:local
site=false
for arg in "$@"; do
  case $arg in
    --site) site=true ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "kernel-image.sh: unknown flag $arg (see --help)" >&2; exit 2 ;;
    *) tag=$arg ;;
  esac
done
command -v docker >/dev/null || { echo "kernel-image.sh: docker is not installed" >&2; exit 1; }

# The system's programs, not a user's shims (pyenv's python3 is a script).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
py=$(readlink -f "$(type -P python3)")
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

# copy puts a host file in the tree at the same path, symlinks on the way
# kept as symlinks, and for a program the shared libraries it loads.
copy() {
  local p=$1
  while [ -L "$p" ]; do
    mkdir -p "$root$(dirname "$p")"
    [ -e "$root$p" ] || cp -P "$p" "$root$p"
    local target
    target=$(readlink "$p")
    case $target in /*) p=$target ;; *) p=$(dirname "$p")/$target ;; esac
  done
  mkdir -p "$root$(dirname "$p")"
  [ -e "$root$p" ] || cp -p "$p" "$root$p"
}
program() {
  local p
  p=$(type -P "$1") || { echo "kernel-image.sh: $1 is not on this machine" >&2; exit 1; }
  copy "$p"
  # ldd prints "name => /path (addr)" or "/path (addr)" for the loader.
  { ldd "$p" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do copy "$lib"; done
}

for b in bash sh cat chmod cp cut date dirname basename env false find grep head id kill ln ls \
         mkdir mkfifo mktemp mv nproc ps readlink echo printf rm rmdir sed setsid sleep sort stat \
         tail timeout touch tr true uname wc whoami xargs; do
  program "$b"
done
program "$py"
mkdir -p "$root/usr/bin"
ln -sf "$py" "$root/usr/bin/python3"
# Python's C extension modules load libraries of their own (ssl, sqlite, ...).
for so in "$stdlib"/lib-dynload/*.so; do
  { ldd "$so" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do copy "$lib"; done
done
mkdir -p "$root$stdlib"
excludes=(--exclude=test --exclude=idlelib --exclude=tkinter --exclude=turtledemo --exclude=ensurepip
          --exclude=lib2to3 --exclude=__pycache__)
$site || excludes+=(--exclude=site-packages --exclude=dist-packages)
tar -C "$stdlib" "${excludes[@]}" -cf - . | tar -C "$root$stdlib" -xf -
if $site; then
  for d in /usr/lib/python3/dist-packages "/usr/local/lib/python$pyver/dist-packages"; do
    [ -d "$d" ] && mkdir -p "$root$d" && tar -C "$d" --exclude=__pycache__ -cf - . | tar -C "$root$d" -xf -
  done
fi

mkdir -p "$root/tmp" "$root/etc" "$root/home/kernel"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/bin/sh\nkernel:x:1000:1000:kernel:/home/kernel:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nkernel:x:1000:\n' >"$root/etc/group"
chown 1000:1000 "$root/home/kernel" 2>/dev/null || true

tar -C "$root" --numeric-owner -cf - . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["sleep", "infinity"]' - "$tag" >/dev/null
size=$(docker image inspect -f '{{.Size}}' "$tag")
echo "built $tag (Python $pyver, $((size >> 20)) MB): kerneldeck --backend docker-image://$tag (?user=kernel runs kernels as uid 1000)"
