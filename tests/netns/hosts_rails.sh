#!/usr/bin/env bash
# hosts_rails.sh — tests/netns/hosts.sh --rails R: R bridges, one veth per host per rail, each rail its own subnet,
# each rail's link optionally capped. Checks, for K=3 hosts and R=3 rails capped at 500mbit:
#   - host i has eth0..eth(R-1) with 10.200.j.(i+1)/24 and nothing else but lo, and a tbf of 500Mbit on each;
#   - every host reaches host 0 on every rail, through that rail's interface (the route the kernel picks);
#   - the rails are separate links: with host 1's rail-1 veth down, host 1 no longer reaches rail 1 and still
#     reaches rails 0 and 2;
#   - bad --rails values are refused with exit status 2 and a message; the exported variables describe the rails.
#   - with zccl-topo's path as argument: `zccl-topo --rails` in a host lists its 3 rails and each local rank's rail.
# Needs root and iproute2; otherwise prints SKIP and exits 77. Prints "hosts_rails: PASSED" at the end.
set -u
here=$(dirname "${BASH_SOURCE[0]}")
fail=0
for bad in 0 9 x; do
    msg=$("$here/hosts.sh" --rails "$bad" 2 1 -- true 2>&1); rc=$?
    if [ "$(id -u)" -eq 0 ] && { [ $rc -ne 2 ] || [[ $msg != *"--rails R must be 1..8"* ]]; }; then
        echo "FAIL: --rails $bad: exit $rc, message: $msg"; fail=1
    fi
done
out=$("$here/hosts.sh" --rails 3 --rate 500mbit 3 1 -- bash -c '
    set -u
    reach() { # ns addr -> 0 if a TCP connect to port 9 is answered (refused counts)
        local p; p=$(ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) || [[ $p == *[Rr]efused* ]]; }
    echo "vars: $HOSTS_K $HOSTS_RAILS [$HOSTS_RAIL_SUBNETS] [$HOSTS_RAIL_ADDR_0] [$HOSTS_RAIL_ADDR_2]"
    ns=($HOSTS_NS)
    for i in 0 1 2; do
        echo "addr $i: $(ip -n ${ns[$i]} -4 -o addr show | awk "{print \$2, \$4}" | sort | tr "\n" " ")"
        echo "tbf $i: $(ip netns exec ${ns[$i]} tc qdisc show | awk "/tbf/ {for (k = 1; k < NF; k++) if (\$k == \"rate\") print \$5, \$(k + 1)}" | sort | tr "\n" " ")"
        for j in 0 1 2; do
            dev=$(ip -n ${ns[$i]} route get 10.200.$j.1 2>/dev/null | sed -n "s/.* dev \([^ ]*\).*/\1/p" | head -1)
            reach ${ns[$i]} 10.200.$j.1 && r=ok || r=no
            echo "route $i $j: $dev $r"
        done
    done
    ip -n ${ns[1]} link set eth1 down
    for j in 0 1 2; do reach ${ns[1]} 10.200.$j.1 && echo "down $j: ok" || echo "down $j: no"; done
' 2>&1); rc=$?
[ $rc -eq 77 ] && { echo "$out"; exit 77; }
want="vars: 3 3 [10.200.0.0/24 10.200.1.0/24 10.200.2.0/24] [10.200.0.1 10.200.0.2 10.200.0.3] [10.200.2.1 10.200.2.2 10.200.2.3]"
for i in 0 1 2; do
    want+=$'\n'"addr $i: eth0 10.200.0.$((i + 1))/24 eth1 10.200.1.$((i + 1))/24 eth2 10.200.2.$((i + 1))/24 lo 127.0.0.1/8 "
    want+=$'\n'"tbf $i: eth0 500Mbit eth1 500Mbit eth2 500Mbit "
    for j in 0 1 2; do
        if [ $i -eq 0 ]; then want+=$'\n'"route $i $j: lo ok"; else want+=$'\n'"route $i $j: eth$j ok"; fi
    done
done
want+=$'\n'"down 0: ok"$'\n'"down 1: no"$'\n'"down 2: ok"
if [ $rc -ne 0 ] || [ "$out" != "$want" ]; then
    echo "FAIL: hosts.sh --rails 3 --rate 500mbit 3 1 (exit $rc): got"; echo "$out"; echo "expected"; echo "$want"
    diff <(echo "$out") <(echo "$want")
    fail=1
else
    echo "$out"
fi
# zccl-topo --rails (optional first argument: its path) inside host 1 of 2 hosts x 3 rails: the rails in subnet
# order, local rank i on rail i mod 3; a ZCCL_SOCKET_IFNAME matching nothing is an error naming it.
if [ -n "${1:-}" ]; then
    topo=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
    got=$("$here/hosts.sh" --rails 3 2 1 -- bash -c 'ns=($HOSTS_NS); ip netns exec ${ns[1]} "$0" --rails --ranks 4;
        ip netns exec ${ns[1]} env ZCCL_SOCKET_IFNAME=nosuch "$0" --rails 2>&1; echo "rc=$?"' "$topo" 2>&1)
    want="TCP rails of this host (every up, non-loopback, non-container IPv4 interface): 3
  rail 0: eth0 10.200.0.2/24
  rail 1: eth1 10.200.1.2/24
  rail 2: eth2 10.200.2.2/24
  (up IPv4 interfaces seen: lo, eth0, eth1, eth2)
Lanes per direction with a peer on the same 3 subnets: 3; local rank i starts on rail i mod 3:
  local rank 0: rail 0 (eth0)
  local rank 1: rail 1 (eth1)
  local rank 2: rail 2 (eth2)
  local rank 3: rail 0 (eth0)
zccl-topo: ZCCL_SOCKET_IFNAME=nosuch matches no up interface with an IPv4 address (TCP rails); up interfaces: lo, eth0, eth1, eth2
rc=1"
    if [ "$got" != "$want" ]; then
        echo "FAIL: zccl-topo --rails: got"; echo "$got"; echo "expected"; echo "$want"; fail=1
    else
        echo "zccl-topo --rails: 3 rails in subnet order, local rank i on rail i mod 3; a bad ZCCL_SOCKET_IFNAME named"
    fi
fi
[ $fail -eq 0 ] && echo "hosts_rails: PASSED" || echo "hosts_rails: FAILED"
exit $fail
