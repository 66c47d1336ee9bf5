#!/usr/bin/env bash
# run_vm.sh — run a command inside a throw-away QEMU VM that has two soft-RoCE (rdma_rxe) devices, and exit with
# the command's exit status. See tests/rdma/README.md.
#
# Usage: tests/rdma/run_vm.sh [options] -- COMMAND [ARG...]
#   --build-dir DIR  cache directory for the initramfs base is DIR/rdma-vm (default: $ZCCL_VM_CACHE or
#                    /tmp/zccl-rdma-vm-$UID)
#   --bin PATH       pack PATH (an executable or shared library) and every library ldd lists for it into the VM, at
#                    the same absolute path (so RPATHs and compiled-in paths keep working); repeatable
#   --file PATH      pack PATH (any file, e.g. a script) at the same absolute path; repeatable
#   --timeout S      kill the VM after S seconds of wall time and fail (default 600)
#   --mem MB         guest memory (default 2048)     --smp N   guest CPUs (default: host CPUs, at most 4)
#   --rebuild        rebuild the cached base even when its inputs did not change
#   --keep-log FILE  also write the guest's console to FILE
# The guest (tests/rdma/guest_init.sh) loads the RDMA modules, creates a veth pair v0 (10.77.0.1) / v1 (10.77.0.2)
# with policy routing so traffic between the two addresses crosses the pair, adds rxe0 over v0 and rxe1 over v1,
# runs COMMAND from the initramfs root as root, prints "ZCCL_VM_EXIT=<status>" and powers off.
# Exit status: COMMAND's, or 77 (skip) when qemu, the kernel image or its modules are missing, 124 on timeout,
# 125 when the VM ended without reporting a status (boot failure, guest panic).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${ZCCL_VM_CACHE:-/tmp/zccl-rdma-vm-$(id -u)}
bins=() files=() timeout_s=600 mem=2048 smp= rebuild=0 keep_log=
while (($#)); do
  case "$1" in
    --build-dir) cache=$2/rdma-vm; shift 2 ;;
    --bin) bins+=("$2"); shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --rebuild) rebuild=1; shift ;;
    --keep-log) keep_log=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "run_vm.sh: unknown option '$1' (usage: run_vm.sh [--bin PATH]... [--file PATH]... -- COMMAND...)" >&2
       exit 2 ;;
  esac
done
(($#)) || { echo "run_vm.sh: no COMMAND given after --" >&2; exit 2; }
skip() { echo "SKIP: $*"; exit 77; }

qemu=$(command -v qemu-system-x86_64 || true)
[[ -n "$qemu" ]] || skip "qemu-system-x86_64 not found (apt-get install qemu-system-x86, or tools/deps.sh --vm)"
kernel=$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1 || true)
[[ -n "$kernel" ]] || skip "no kernel image /boot/vmlinuz-* (apt-get install linux-image-amd64)"
[[ -r "$kernel" ]] || skip "$kernel is not readable (run as root, or make it readable: some distributions install it mode 0600)"
kver=${kernel#/boot/vmlinuz-}
moddir=/lib/modules/$kver
[[ -r "$moddir/modules.dep" ]] || skip "$moddir/modules.dep missing (modules of $kver not installed)"
for t in busybox cpio gzip ldd rdma ibv_rc_pingpong rping ib_write_bw ip; do
  command -v "$t" >/dev/null || skip "'$t' not found (tools/deps.sh --vm installs the soft-RoCE VM's packages)"
done
busybox=$(command -v busybox)
"$busybox" --list | grep -x insmod >/dev/null || skip "$busybox has no insmod applet (apt-get install busybox-static)"
if ldd "$busybox" >/dev/null 2>&1; then skip "$busybox is dynamically linked (apt-get install busybox-static)"; fi
rxe_provider=$(ls -1 /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | head -1 || true)
[[ -n "$rxe_provider" && -r /etc/libibverbs.d/rxe.driver ]] ||
  skip "libibverbs' rxe provider missing (apt-get install ibverbs-providers)"

# Modules in load order (dependencies first, from modules.dep; .ko.xz/.ko.zst are decompressed when packing).
wanted=(configfs crc32_generic veth ib_core ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe iw_cm ib_cm rdma_cm rdma_ucm)
declare -A dep_of=() seen=()
while IFS= read -r line; do
  m=${line%%:*}; n=${m##*/}; n=${n%%.ko*}; n=${n//-/_}
  dep_of[$n]="$m:${line#*:}"
done < "$moddir/modules.dep"
order=()
visit() { # module name (underscores)
  local n=$1 entry path d
  [[ -n "${seen[$n]:-}" ]] && return 0
  seen[$n]=1
  entry=${dep_of[$n]:-}
  [[ -n "$entry" ]] || { grep -qE "/$n\.ko" "$moddir/modules.builtin" 2>/dev/null && return 0
                         skip "kernel module $n not found for $kver (neither in modules.dep nor built in)"; }
  path=${entry%%:*}
  for d in ${entry#*:}; do d=${d##*/}; d=${d%%.ko*}; visit "${d//-/_}"; done
  order+=("$path")
}
for m in "${wanted[@]}"; do visit "$m"; done

# Files of the base: busybox, iproute2's ip (as netip: busybox's shell would run its own ip applet for "ip", and
# iproute2's ip takes what follows "ip" in its own name as a command, so "ipr" would mean "ip route") and rdma,
# the verbs / rdma_cm tools used by the sanity check, and the rxe provider.
tools=(/usr/bin/rdma "$(command -v ip)" /usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/ibv_rc_pingpong
       /usr/bin/rping /usr/bin/ucmatose /usr/bin/ib_write_bw "$rxe_provider")
# glibc loads libgcc_s at run time (pthread_exit, pthread_cancel, backtraces); ldd does not list it.
libgcc=$(gcc -print-file-name=libgcc_s.so.1 2>/dev/null || true)
[[ -e "$libgcc" && "$libgcc" == /* ]] || libgcc=/lib/x86_64-linux-gnu/libgcc_s.so.1
[[ -e "$libgcc" ]] && tools+=("$libgcc")
key=$( { echo "$kernel $(stat -c '%s %Y' "$kernel")"; printf '%s\n' "${order[@]}";
         for f in "$busybox" "${tools[@]}" "$here/guest_init.sh" "$0"; do echo "$f $(stat -L -c '%s %Y' "$f")"; done; } |
       sha256sum | cut -c1-16)
mkdir -p "$cache"
base=$cache/base-$key.cpio.gz

# copy_with_libs ROOT PATH: PATH at the same absolute path under ROOT, plus every library ldd resolves for it
# (under its directory's canonical path, keeping the name the loader asks for) and the dynamic loader.
copy_file() { # root path
  local dst=$1$(readlink -f "$(dirname "$2")")/$(basename "$2")
  [[ -e "$dst" ]] && return 0
  mkdir -p "$(dirname "$dst")" && cp -L "$2" "$dst"
}
copy_with_libs() {
  local root=$1 p=$2 lib
  [[ -e "$p" ]] || { echo "run_vm.sh: $p does not exist" >&2; return 1; }
  copy_file "$root" "$p"
  # ldd prints "name => /path (addr)" for libraries and "/lib64/ld-linux... (addr)" for the loader.
  while read -r lib; do copy_file "$root" "$lib"; done < <(ldd "$p" 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
}
make_cpio() { # dir out.cpio.gz
  (cd "$1" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 > "$2.tmp"
  mv "$2.tmp" "$2"
}

if [[ ! -s "$base" || $rebuild -eq 1 ]]; then
  t0=$(date +%s.%N)
  stage=$(mktemp -d "$cache/stage.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage"/{usr/bin,usr/sbin,usr/lib,usr/lib64,etc/libibverbs.d,etc/zccl-vm,proc,sys,dev,run,tmp,root,var}
  ln -s usr/bin "$stage/bin"; ln -s usr/sbin "$stage/sbin"; ln -s usr/lib "$stage/lib"; ln -s usr/lib64 "$stage/lib64"
  ln -s ../run "$stage/var/run"
  cp "$busybox" "$stage/usr/bin/busybox"
  for t in "${tools[@]}"; do copy_with_libs "$stage" "$t"; done
  mv "$stage/usr/sbin/ip" "$stage/usr/bin/netip" 2>/dev/null || mv "$stage/usr/bin/ip" "$stage/usr/bin/netip"
  for a in $("$busybox" --list); do
    [[ -e "$stage/usr/bin/$a" || -e "$stage/usr/sbin/$a" ]] || ln -s busybox "$stage/usr/bin/$a"
  done
  cp /etc/libibverbs.d/rxe.driver "$stage/etc/libibverbs.d/"
  mkdir -p "$stage/lib/modules/$kver"
  : > "$stage/etc/zccl-vm/modules"
  for m in "${order[@]}"; do
    b=$(basename "$m"); n=${b%%.ko*}.ko
    case "$b" in
      *.ko) cp "$moddir/$m" "$stage/lib/modules/$kver/$n" ;;
      *.ko.xz) xz -dc "$moddir/$m" > "$stage/lib/modules/$kver/$n" ;;
      *.ko.zst) zstd -qdc "$moddir/$m" > "$stage/lib/modules/$kver/$n" ;;
      *.ko.gz) gzip -dc "$moddir/$m" > "$stage/lib/modules/$kver/$n" ;;
      *) echo "run_vm.sh: unknown module format $m" >&2; exit 1 ;;
    esac
    echo "/lib/modules/$kver/$n" >> "$stage/etc/zccl-vm/modules"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\n' > "$stage/etc/passwd"
  printf 'root:x:0:\n' > "$stage/etc/group"
  printf '127.0.0.1 localhost\n10.77.0.1 vm0\n10.77.0.2 vm1\n' > "$stage/etc/hosts"
  install -m 0755 "$here/guest_init.sh" "$stage/init"
  rm -f "$cache"/base-*.cpio.gz
  make_cpio "$stage" "$base"
  rm -rf "$stage"; trap - EXIT
  echo "run_vm.sh: built initramfs base $base ($(du -h "$base" | cut -f1), $(awk -v a="$t0" -v b="$(date +%s.%N)" \
       'BEGIN { printf "%.1f", b - a }') s)"
fi

# The per-run part: the given binaries with their libraries, the given files, and the command (/etc/zccl-vm/cmd).
work=$(mktemp -d "$cache/run.XXXXXX")
qpid=
cleanup() { [[ -n "$qpid" ]] && kill -9 "$qpid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/root/etc/zccl-vm"
for b in "${bins[@]}"; do copy_with_libs "$work/root" "$b"; done
for f in "${files[@]}"; do
  [[ -e "$f" ]] || { echo "run_vm.sh: $f does not exist" >&2; exit 2; }
  mkdir -p "$work/root$(dirname "$(readlink -f "$f")")"; cp -L "$f" "$work/root$(readlink -f "$f")"
done
{ printf 'cd %q 2>/dev/null || cd /\n' "$PWD"; printf '%q ' "$@"; echo; } > "$work/root/etc/zccl-vm/cmd"
make_cpio "$work/root" "$work/extra.cpio.gz"
cat "$base" "$work/extra.cpio.gz" > "$work/initrd"   # the kernel unpacks concatenated archives in order

if [[ -z "$smp" ]]; then smp=$(nproc); ((smp > 4)) && smp=4; fi
log=$work/console.log
: > "$log" # exists before `tail -f` below starts (the background qemu's redirection may open it later)
t0=$(date +%s.%N)
# TCG (software emulation; KVM is not used), serial console on stdio, no NIC (the guest's network is a veth pair).
"$qemu" -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem" -nographic -no-reboot -nic none \
  -kernel "$kernel" -initrd "$work/initrd" \
  -append "console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init" < /dev/null > "$log" 2>&1 &
qpid=$!
# Stream the console while waiting; kill the VM at the deadline.
tail -n +1 -f --pid="$qpid" "$log" &
tpid=$!
deadline=$(( $(date +%s) + timeout_s ))
timed_out=0
while kill -0 "$qpid" 2>/dev/null; do
  if (( $(date +%s) >= deadline )); then timed_out=1; kill -9 "$qpid" 2>/dev/null; break; fi
  sleep 0.5
done
wait "$qpid" 2>/dev/null || true
qpid=
wait "$tpid" 2>/dev/null || true
[[ -n "$keep_log" ]] && cp "$log" "$keep_log"
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if ((timed_out)); then
  echo "run_vm.sh: FAILED: the VM was still running after $timeout_s s (killed)"; exit 124
fi
rc=$(tr -d '\r' < "$log" | sed -n 's/^ZCCL_VM_EXIT=\([0-9][0-9]*\)$/\1/p' | tail -1)
if [[ -z "$rc" ]]; then
  echo "run_vm.sh: FAILED: the VM ended after $elapsed s without reporting the command's exit status"; exit 125
fi
echo "run_vm.sh: VM ran $elapsed s in all; command exit status $rc"
exit "$rc"
