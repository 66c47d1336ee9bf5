#!/bin/sh
# guest_init.sh — /init of the soft-RoCE test VM built by tests/rdma/run_vm.sh (runs under busybox sh as PID 1).
# Loads the RDMA modules, builds the network (veth pair v0 10.77.0.1 / v1 10.77.0.2 in the initial namespace —
# rdma_rxe in Linux 6.1 sends and receives RoCE only there — with policy routing so that traffic from one address
# to the other crosses the pair instead of the loopback device), adds rxe0 over v0 and rxe1 over v1, and the same
# again on an independent second pair (v2 10.78.0.1 / v3 10.78.0.2, rxe2 over v2, rxe3 over v3: a rank on rxe0 and
# rxe2 talking to one on rxe1 and rxe3 has two rails that fail separately), runs the command in /etc/zccl-vm/cmd,
# prints "ZCCL_VM_EXIT=<status>" and powers off. Any setup failure reports ZCCL_VM_EXIT=120 (with the reason) so
# the host never waits for a command that cannot run.
# "sh /init pair2" (from a guest command, as root) deletes and builds the second pair and its rxe devices again: a
# link that was down leaves rdma_cm unreliable on it, so a test that downs it can start afresh. "sh /init pair3"
# builds (or builds again) a third pair on demand (v4 10.79.0.1 / v5 10.79.0.2, rxe4 over v4, rxe5 over v5: three
# rails that fail separately) and "sh /init nopair3" deletes it; it is not there otherwise, so every other test sees
# rxe0..rxe3 only.
export PATH=/usr/bin:/usr/sbin HOME=/root TERM=dumb
export ZCCL_VM=1 ZCCL_VM_ADDR0=10.77.0.1 ZCCL_VM_ADDR1=10.77.0.2 ZCCL_VM_DEV0=rxe0 ZCCL_VM_DEV1=rxe1
mode=$1
export ZCCL_VM_ADDR2=10.78.0.1 ZCCL_VM_ADDR3=10.78.0.2 ZCCL_VM_DEV2=rxe2 ZCCL_VM_DEV3=rxe3
finish() { # status
  echo "ZCCL_VM_EXIT=$1"
  sync
  poweroff -f
  sleep 5
}
die() { echo "zccl-vm: setup failed: $*"; [ -n "$mode" ] && exit 120; finish 120; }

# add_pair A B NET TABLE: veth pair vA (NET.1) / vB (NET.2), e.g. 0 1 10.77.0 100. Locally generated packets to the
# other address leave through the pair (tables TABLE/TABLE+1, preferences 10+A/10+B) instead of through lo; packets
# arriving on the pair still find their address in the local table (moved from preference 0 to 100); an address
# talking to itself stays on lo (preference 9). Then rxeA over vA and rxeB over vB.
add_pair() {
  a=v$1 b=v$2 ia=$3.1 ib=$3.2 ta=$4 tb=$(($4 + 1))
  netip link add $a type veth peer name $b || die "creating the veth pair $a/$b"
  netip addr add $ia/24 dev $a && netip addr add $ib/24 dev $b || die "addresses of $a/$b"
  for c in $a $b; do
    sysctl -qw net.ipv4.conf.$c.rp_filter=0
    sysctl -qw net.ipv4.conf.$c.accept_local=1
  done
  netip link set $a up && netip link set $b up || die "link up $a/$b"
  netip rule add pref 9 from $ia to $ia lookup local
  netip rule add pref 9 from $ib to $ib lookup local
  netip route add $ib/32 dev $a src $ia table $ta && netip rule add pref $((10 + $1)) iif lo to $ib lookup $ta ||
    die "route $a -> $b"
  netip route add $ia/32 dev $b src $ib table $tb && netip rule add pref $((10 + $2)) iif lo to $ia lookup $tb ||
    die "route $b -> $a"
  netip neigh replace $ib lladdr "$(cat /sys/class/net/$b/address)" dev $a nud permanent
  netip neigh replace $ia lladdr "$(cat /sys/class/net/$a/address)" dev $b nud permanent
  rdma link add rxe$1 type rxe netdev $a || die "rdma link add rxe$1"
  rdma link add rxe$2 type rxe netdev $b || die "rdma link add rxe$2"
}
# wait_active DEV...: every port ACTIVE with its IPv4-mapped RoCE v2 GID (10.77/10.78/10.79: ffff:0a4d/0a4e/0a4f).
wait_active() {
  for i in $(seq 100); do
    ok=1
    for d in "$@"; do
      grep -q ACTIVE /sys/class/infiniband/$d/ports/1/state 2>/dev/null || ok=0
      grep -qsE 'ffff:0a4[def]:000' /sys/class/infiniband/$d/ports/1/gids/* || ok=0
    done
    [ $ok = 1 ] && return 0
    sleep 0.1
  done
  rdma link show
  return 1
}
# del_pair A B NET TABLE: undoes add_pair A B NET TABLE (nothing is left of it when it was not there).
del_pair() {
  rdma link delete rxe$1 2>/dev/null; rdma link delete rxe$2 2>/dev/null
  netip link del v$1 2>/dev/null
  netip rule del pref 9 from $3.1 to $3.1 2>/dev/null; netip rule del pref 9 from $3.2 to $3.2 2>/dev/null
  netip rule del pref $((10 + $1)) 2>/dev/null; netip rule del pref $((10 + $2)) 2>/dev/null
  netip route flush table $4 2>/dev/null; netip route flush table $(($4 + 1)) 2>/dev/null
  return 0
}
case "$mode" in # rebuild the second pair, build or delete the third (see the top)
  pair2) del_pair 2 3 10.78.0 102; add_pair 2 3 10.78.0 102
         wait_active rxe2 rxe3 || die "rxe2/rxe3 not ACTIVE with an IPv4 GID"; exit 0 ;;
  pair3) del_pair 4 5 10.79.0 104; add_pair 4 5 10.79.0 104
         wait_active rxe4 rxe5 || die "rxe4/rxe5 not ACTIVE with an IPv4 GID"; exit 0 ;;
  nopair3) del_pair 4 5 10.79.0 104; exit 0 ;;
esac
t0=$(cut -d' ' -f1 /proc/uptime 2>/dev/null)

mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev || die "mounting proc/sys/dev"
mkdir -p /dev/pts /dev/shm
# /tmp stays on the initramfs root (already in RAM): a tmpfs there would hide files packed under /tmp
mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm; mount -t tmpfs tmpfs /run; chmod 1777 /tmp
t0=$(cut -d' ' -f1 /proc/uptime)
for m in $(cat /etc/zccl-vm/modules); do
  insmod "$m" || die "insmod $m"
done
mount -t configfs configfs /sys/kernel/config || die "mounting configfs"

netip link set lo up
for c in all default; do
  sysctl -qw net.ipv4.conf.$c.rp_filter=0
  sysctl -qw net.ipv4.conf.$c.accept_local=1
done
netip rule add pref 100 lookup local && netip rule del pref 0 lookup local || die "moving the local rule"
add_pair 0 1 10.77.0 100
add_pair 2 3 10.78.0 102
# Wait for the ports to be ACTIVE and their IPv4-mapped RoCE v2 GIDs to appear (a few hundred ms at most).
wait_active rxe0 rxe1 rxe2 rxe3 || die "rxe ports not ACTIVE with an IPv4 GID"
t1=$(cut -d' ' -f1 /proc/uptime)
echo "zccl-vm: up at ${t1} s since kernel start (modules + network + rxe: $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s); $(nproc) CPUs, $(awk '/MemTotal/{printf "%d MiB", $2/1024}' /proc/meminfo)"
rdma link show
sh /etc/zccl-vm/cmd
rc=$?
t2=$(cut -d' ' -f1 /proc/uptime)
echo "zccl-vm: command finished with status $rc after $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.1f", b-a}') s"
finish $rc
