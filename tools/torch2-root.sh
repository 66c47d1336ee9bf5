#!/usr/bin/env bash
# Builds and tests the torch backend (bindings/torch) against torch 2.x: a Debian 13 (trixie) root, made with
# debootstrap and Debian's packages (python3-torch 2.6 CPU, libtorch-dev, pybind11, gcc 14, Python 3.13), where
# libzccl and zccl_torch are built from this checkout with cmake and `ctest -L torch` runs.
#
# Usage: tools/torch2-root.sh [--prepare | --shell | -- COMMAND...]
#   (no argument)  create or reuse the root, build inside it, run ctest -L torch (its exit status is the script's)
#   --prepare      create or reuse the root only (no mounts, no build): .ci/run starts this in the background at
#                  nice 19 when CI begins, so the download and unpacking overlap the main suite
#   --shell        the same root and mounts, an interactive shell instead of the build
#   -- COMMAND...  the same, COMMAND run in the root (in /src, the checkout) after the build
# Environment:
#   ZCCL_TORCH2_ROOT    where the root lives (default /var/cache/zccl/torch2-root; outside the checkout, kept
#                       between runs; its build tree is ROOT/build)
#   ZCCL_TORCH2_MIRROR  the Debian archive (default http://deb.debian.org/debian)
#   ZCCL_TORCH2_REBUILD=1  make the root again even when it is current
#   ZCCL_TORCH2_CTEST   extra ctest arguments (e.g. "-R Torch.ops")
#
# Reuse: ROOT/.zccl-stamp holds the package list and the hash of this script's create_root function; a root whose
# stamp differs is made again (into ROOT.new, then swapped in, so a failed creation never leaves a half root),
# except when only the package list changed: then apt-get installs the list in the existing root.
#   ZCCL_DEEPSPEED_SRC  a DeepSpeed source tree (default /var/cache/zccl/deepspeed), bind-mounted read-only at
#                       /opt/deepspeed in the root when it exists (test_deepspeed.py skips without it)
# Mounts: the checkout is bind-mounted at ROOT/src (../shared, the data sets, at ROOT/shared, read-only), /proc, /sys and /dev (not recursive) are bound, and /dev/shm is
# a fresh tmpfs of the root's own (the tests' segments never meet the host's); every mount is undone on exit, and
# a mount that is still there afterwards (left by a test) fails the run. A lock (ROOT.lock) serialises runs.
# Without root, without debootstrap (installed with apt-get when missing) or without the archive it prints
# "SKIP: <reason>" and exits 0.
set -euo pipefail

SRC="$(cd "$(dirname "$0")/.." && pwd)"
ROOT="${ZCCL_TORCH2_ROOT:-/var/cache/zccl/torch2-root}"
MIRROR="${ZCCL_TORCH2_MIRROR:-http://deb.debian.org/debian}"
SUITE=trixie
PKGS=(python3-torch libtorch-dev pybind11-dev python3-pytest python3-numpy python3-setuptools python3-dev
      cmake make g++ gcc pkg-config ninja-build libssl-dev libhwloc-dev libxml2-dev libjansson-dev zlib1g-dev
      googletest libgtest-dev procps iproute2 ca-certificates
      # DeepSpeed's Python dependencies (its source is not packaged: test_deepspeed.py takes a fetched tree)
      python3-einops python3-hjson python3-msgpack python3-packaging python3-psutil python3-cpuinfo
      python3-pydantic python3-tqdm)

skip() { echo "tools/torch2-root.sh: SKIP: $*"; exit 0; }
say() { echo "tools/torch2-root.sh: $*"; }

mode=build
case "${1:-}" in
  "") ;;
  --prepare) mode=prepare ;;
  --shell) mode=shell ;;
  --) shift; mode=command; [ $# -gt 0 ] || { echo "usage: $0 [--prepare | --shell | -- COMMAND...]" >&2; exit 2; } ;;
  -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--prepare | --shell | -- COMMAND...]" >&2; exit 2 ;;
esac

[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot and mounts); run it as root"
if ! command -v debootstrap >/dev/null; then
  say "debootstrap missing: apt-get install debootstrap"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap; } \
    >/dev/null 2>&1 || skip "debootstrap is not installed and apt-get could not install it"
fi
command -v debootstrap >/dev/null || skip "debootstrap is not installed"

# Creates the root in $1 (everything that decides a root's contents is here: its hash is in the stamp).
create_root() {
  # (called in an `if`, where set -e does not act: every step is chained)
  local dir="$1" rc=0
  debootstrap --variant=minbase --components=main "$SUITE" "$dir" "$MIRROR" || return 1
  cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$dir/etc/apt/apt.conf.d/90zccl" || return 1
  mount -t proc proc "$dir/proc" || return 1
  chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    bash -c "apt-get update -q && apt-get install -y -q ${PKGS[*]} && apt-get clean" || rc=1
  umount "$dir/proc" || rc=1
  return $rc
}

stamp_text() {
  echo "suite=$SUITE mirror=$MIRROR"
  echo "packages=${PKGS[*]}"
  echo "create_root=$(declare -f create_root | sha256sum | cut -d' ' -f1)"
}

mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9

MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" 2>/dev/null || say "could not unmount ${MOUNTS[i]}"
  done
  MOUNTS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

want="$(stamp_text)"
have="$(cat "$ROOT/.zccl-stamp" 2>/dev/null || true)"
same_recipe() { [ "$(sed -n 1p <<<"$have")" = "$(sed -n 1p <<<"$want")" ] && [ "$(sed -n 3p <<<"$have")" = "$(sed -n 3p <<<"$want")" ]; }
if [ "${ZCCL_TORCH2_REBUILD:-0}" != 1 ] && [ "$have" = "$want" ]; then
  say "reusing $ROOT (current: $(sed -n 2p "$ROOT/.zccl-stamp" | cut -c1-60)...)"
elif [ "${ZCCL_TORCH2_REBUILD:-0}" != 1 ] && [ -n "$have" ] && same_recipe; then
  say "reusing $ROOT; the package list changed: apt-get install in it"
  t0=$(date +%s)
  mount -t proc proc "$ROOT/proc"
  arc=0
  chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    bash -c "apt-get update -q && apt-get install -y -q ${PKGS[*]} && apt-get clean" >"$ROOT.add.log" 2>&1 || arc=$?
  umount "$ROOT/proc"
  [ $arc = 0 ] || { tail -n 30 "$ROOT.add.log"; say "apt-get install in the root failed (log: $ROOT.add.log)"; exit 1; }
  echo "$want" >"$ROOT/.zccl-stamp"
  say "packages installed in $(($(date +%s) - t0)) s"
else
  # the archive must answer before anything is written
  if ! curl -fsS --max-time 20 -o /dev/null "$MIRROR/dists/$SUITE/Release" 2>/dev/null &&
     ! wget -q -T 20 -O /dev/null "$MIRROR/dists/$SUITE/Release" 2>/dev/null; then
    skip "the Debian archive $MIRROR does not answer (dists/$SUITE/Release)"
  fi
  say "creating $ROOT (debootstrap $SUITE from $MIRROR, then ${#PKGS[@]} packages)"
  t0=$(date +%s)
  rm -rf "$ROOT.new"
  mkdir -p "$ROOT.new"
  if ! create_root "$ROOT.new" >"$ROOT.new.log" 2>&1; then
    tail -n 30 "$ROOT.new.log"
    umount "$ROOT.new/proc" 2>/dev/null || true
    if grep -q -E 'Failed getting release file|Temporary failure resolving|Could not resolve|Unable to fetch' "$ROOT.new.log"; then
      skip "the Debian archive $MIRROR could not be fetched from (see $ROOT.new.log)"
    fi
    say "creating the root failed (log: $ROOT.new.log)"
    exit 1
  fi
  echo "$want" >"$ROOT.new/.zccl-stamp"
  if [ -d "$ROOT" ]; then mv "$ROOT" "$ROOT.old"; fi
  mv "$ROOT.new" "$ROOT"
  rm -rf "$ROOT.old"
  say "created $ROOT in $(($(date +%s) - t0)) s ($(du -sh "$ROOT" | cut -f1))"
fi

if [ "$mode" = prepare ]; then say "the root is ready: $ROOT"; exit 0; fi

bind() { # bind SRCDIR TARGET [mount options...]
  local src="$1" dst="$2"; shift 2
  mkdir -p "$dst"
  mount "$@" "$src" "$dst"
  MOUNTS+=("$dst")
}
before="$(findmnt -rn -o TARGET | grep -c "^$ROOT/" || true)"
[ "$before" = 0 ] || { say "mounts under $ROOT already exist (another run, or one left behind):"; findmnt -rn -o TARGET | grep "^$ROOT/"; exit 1; }
bind proc "$ROOT/proc" -t proc
bind sysfs "$ROOT/sys" -t sysfs -o ro
bind /dev "$ROOT/dev" --bind
bind tmpfs "$ROOT/dev/shm" -t tmpfs -o mode=1777,size=50%
bind "$SRC" "$ROOT/src" --bind
# The build tree (ROOT/build) belongs to one checkout: make compares times, so objects built from another checkout
# (a CI clone, then the working tree) look newer than this one's sources and are kept. Another checkout: start over.
if [ "$(cat "$ROOT/build/.zccl-checkout" 2>/dev/null)" != "$SRC" ]; then
  rm -rf "$ROOT/build"
  mkdir -p "$ROOT/build"
  printf '%s\n' "$SRC" >"$ROOT/build/.zccl-checkout"
fi
# the data sets next to the checkout (../shared: test_ddp's digits), read-only, where the tests look for them
if [ -d "$SRC/../shared/data" ]; then bind "$SRC/../shared" "$ROOT/shared" --bind -o ro; fi
DS="${ZCCL_DEEPSPEED_SRC:-/var/cache/zccl/deepspeed}"
if [ -d "$DS/deepspeed" ]; then bind "$DS" "$ROOT/opt/deepspeed" --bind -o ro; fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true

jobs="$(nproc)"
# USE_LIBUV=0: Debian 13's torch is built without libuv, and its TCPStore (tcp:// and env:// rendezvous, torchrun)
# asks for libuv unless told otherwise ("use_libuv was requested but PyTorch was build without libuv support")
inner=(/usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 USE_LIBUV=0
       TERM="${TERM:-dumb}" TORCH2_CTEST_ARGS="${ZCCL_TORCH2_CTEST:-}" JOBS="$jobs") # not ZCCL_*: zccl warns of names it does not know
build_cmd='set -e
t0=$(date +%s)
cmake -S /src -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZCCL_BUILD_TORCH=ON -DZCCL_TORCH_PYTHON=/usr/bin/python3 >/build.configure.log 2>&1 || { tail -n 40 /build.configure.log; exit 1; }
grep "torch backend" /build.configure.log || true
cmake --build /build -j"$JOBS" --target zccl zcclrun zccl_torch
t1=$(date +%s)
echo "tools/torch2-root.sh: built in $((t1 - t0)) s (python3 $(python3 -c "import sys; print(sys.version.split()[0])"), torch $(python3 -c "import torch; print(torch.__version__)"))"
rc=0
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
ctest --test-dir /build -L torch --output-on-failure --timeout 900 $TORCH2_CTEST_ARGS || rc=$?
echo "tools/torch2-root.sh: ctest -L torch took $(($(date +%s) - t1)) s (rc $rc); pytest counts per test:"
/src/tools/torch-counts.sh /build/Testing/Temporary/LastTest.log
exit $rc'
rc=0
case "$mode" in
  build) chroot "$ROOT" "${inner[@]}" bash -c "$build_cmd" || rc=$? ;;
  shell) chroot "$ROOT" "${inner[@]}" bash -c "cd /src && exec bash -i" || rc=$? ;;
  command)
    chroot "$ROOT" "${inner[@]}" BUILD_ONLY=1 bash -c "$build_cmd" || rc=$?
    [ $rc = 0 ] || { cleanup; exit $rc; }
    chroot "$ROOT" "${inner[@]}" PYTHONPATH=/build/bindings/torch/python bash -c 'cd /src && exec "$@"' inner "$@" || rc=$? ;;
esac

cleanup
left="$(findmnt -rn -o TARGET | grep "^$ROOT/" || true)"
if [ -n "$left" ]; then
  say "FAIL: mounts left under $ROOT after the run:"; echo "$left"
  while read -r m; do umount -l "$m" 2>/dev/null || true; done <<<"$(echo "$left" | sort -r)"
  exit 1
fi
exit $rc
