#!/bin/sh
# guest_init.sh — /init of the soft-RoCE test VM built by tests/rdma/run_vm.sh (runs under busybox sh as PID 1).
# Loads the RDMA modules, builds the network (veth pair v0 10.77.0.1 / v1 10.77.0.2 in the initial namespace —
# rdma_rxe in Linux 6.1 sends and receives RoCE only there — with policy routing so that traffic from one address
# to the other crosses the pair instead of the loopback device), adds rxe0 over v0 and rxe1 over v1, runs the
# command in /etc/zccl-vm/cmd, prints "ZCCL_VM_EXIT=<status>" and powers off. Any setup failure reports
# ZCCL_VM_EXIT=120 (with the reason) so the host never waits for a command that cannot run.
export PATH=/usr/bin:/usr/sbin HOME=/root TERM=dumb
export ZCCL_VM=1 ZCCL_VM_ADDR0=10.77.0.1 ZCCL_VM_ADDR1=10.77.0.2 ZCCL_VM_DEV0=rxe0 ZCCL_VM_DEV1=rxe1
finish() { # status
  echo "ZCCL_VM_EXIT=$1"
  sync
  poweroff -f
  sleep 5
}
die() { echo "zccl-vm: setup failed: $*"; finish 120; }
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
netip link add v0 type veth peer name v1 || die "creating the veth pair"
netip addr add 10.77.0.1/24 dev v0 && netip addr add 10.77.0.2/24 dev v1 || die "addresses"
for c in all default v0 v1; do
  sysctl -qw net.ipv4.conf.$c.rp_filter=0
  sysctl -qw net.ipv4.conf.$c.accept_local=1
done
netip link set v0 up && netip link set v1 up || die "link up"
# Locally generated packets to the other address leave through the pair (tables 100/101) instead of through lo;
# packets arriving on the pair still find their address in the local table (moved from preference 0 to 100);
# an address talking to itself stays on lo (preference 9).
netip rule add pref 100 lookup local && netip rule del pref 0 lookup local || die "moving the local rule"
netip rule add pref 9 from 10.77.0.1 to 10.77.0.1 lookup local
netip rule add pref 9 from 10.77.0.2 to 10.77.0.2 lookup local
netip route add 10.77.0.2/32 dev v0 src 10.77.0.1 table 100 && netip rule add pref 10 iif lo to 10.77.0.2 lookup 100 ||
  die "route v0 -> v1"
netip route add 10.77.0.1/32 dev v1 src 10.77.0.2 table 101 && netip rule add pref 11 iif lo to 10.77.0.1 lookup 101 ||
  die "route v1 -> v0"
netip neigh replace 10.77.0.2 lladdr "$(cat /sys/class/net/v1/address)" dev v0 nud permanent
netip neigh replace 10.77.0.1 lladdr "$(cat /sys/class/net/v0/address)" dev v1 nud permanent
rdma link add rxe0 type rxe netdev v0 || die "rdma link add rxe0"
rdma link add rxe1 type rxe netdev v1 || die "rdma link add rxe1"
# Wait for both ports to be ACTIVE and their IPv4-mapped RoCE v2 GIDs to appear (a few hundred ms at most).
ok=0
for i in $(seq 100); do
  ok=1
  for d in rxe0 rxe1; do
    grep -q ACTIVE /sys/class/infiniband/$d/ports/1/state 2>/dev/null || ok=0
    grep -qs 'ffff:0a4d:000' /sys/class/infiniband/$d/ports/1/gids/* || ok=0
  done
  [ $ok = 1 ] && break
  sleep 0.1
done
[ $ok = 1 ] || { rdma link show; die "rxe ports not ACTIVE with an IPv4 GID"; }
t1=$(cut -d' ' -f1 /proc/uptime)
echo "zccl-vm: up at ${t1} s since kernel start (modules + network + rxe: $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s); $(nproc) CPUs, $(awk '/MemTotal/{printf "%d MiB", $2/1024}' /proc/meminfo)"
rdma link show
sh /etc/zccl-vm/cmd
rc=$?
t2=$(cut -d' ' -f1 /proc/uptime)
echo "zccl-vm: command finished with status $rc after $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.1f", b-a}') s"
finish $rc
