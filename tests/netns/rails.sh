#!/usr/bin/env bash
# rails.sh ZCCLRUN ZCCL_BENCH K M R [MODE] — collectives striped over R TCP rails between K simulated hosts with M
# ranks each (tests/netns/hosts.sh --rails R: one veth per host per rail, each rail its own subnet).
# MODE (default "all"):
#   all      every collective (all-reduce, reduce-scatter, all-gather, broadcast, reduce, all-to-all, gather,
#            scatter) with every datatype and op, element-checked by zccl-bench -c 1, at sizes that travel whole and
#            sizes that are striped; then all-reduce and all-to-all with ZCCL_NSOCKS_PERTHREAD=2 (2R sockets per pair)
#            and with ZCCL_TCP_STRIPE_MIN_BYTES=0; every rail must carry connections between hosts (the INFO lines
#            "connected to rank P over TCP socket K on rail ethJ"), every host must have talked to another, and
#            each rank's socket 0 must be on rail (local rank mod R).
#   badifname  ZCCL_SOCKET_IFNAME=nosuchif: every rank fails at init naming the setting, within the deadline.
#   subnets  host 1's rail-1 address moved to another subnet: the pairs share one rail, so they fall back to one
#            connection (INFO says so, naming the rail), and the results are right.
#   unreachable  rail 1 is in both hosts' records but host 1's bridge port is down: lanes that cannot connect
#            there move to rail 0 (a WARN names the rail) and the results are right.
#   counts   host 1 has one rail fewer (its last veth deleted): ranks see different rail counts; pairs use the
#            subnets both have (INFO names them) and the results are right.
# zcclrun --timeout is each run's deadline. Prints "rails: PASSED" at the end. Needs root and iproute2; otherwise
# prints SKIP and exits 77.
set -u
RUN=${1:?usage: rails.sh ZCCLRUN ZCCL_BENCH K M R [MODE]}
BENCH=${2:?usage: rails.sh ZCCLRUN ZCCL_BENCH K M R [MODE]}
K=${3:?K hosts}
M=${4:?M ranks per host}
R=${5:?R rails}
MODE=${6:-all}
DEADLINE=${RAILS_DEADLINE_S:-120}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"

hosts_scratch out || exit 1
hosts_up "$K" "" "$R"; rc=$?
[ $rc -eq 0 ] || exit $rc
hosts_hostfile "$M" "$out/hostfile" || exit 1
N=$((K * M))
fail=0

# run NAME ENV... -- BENCH-ARGS...: one zcclrun job; output in $out/NAME.out; returns its status.
run() {
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=TCP "${envs[@]}" "$RUN" --hostfile "$out/hostfile" --timeout "$DEADLINE" \
        --tag-output "$BENCH" "$@" >"$out/$name.out" 2>&1
}

# check NAME: the job passed its element check, and every rank connected to every other-host rank on every rail.
check() {
    local name=$1 rc=$2 want_rails=$3
    if [ "$rc" -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" "$out/$name.out"; then
        echo "FAIL: $name: exit status $rc$([ "$rc" = 124 ] && echo " (deadline $DEADLINE s)")"
        grep -v "zccl INFO" "$out/$name.out" | tail -n 15; fail=1; return
    fi
    # Connections open when first needed, so a pair that only ever exchanged small messages has only socket 0. Every
    # rail must carry some pair's connection, every host must have talked to another, and each rank's socket 0 (its
    # small messages) must be on rail (local rank mod rails): hosts.sh's rail j is ethj, subnet 10.200.j.0/24.
    local got rails hosts bad0
    got=$(awk -v m="$M" -v nr="$want_rails" '
        match($0, /^\[[0-9]+\]/) && /connected to rank [0-9]+ over TCP socket [0-9]+ on rail / {
            r = substr($0, 2, RLENGTH - 2) + 0
            p = $0; sub(/.*connected to rank /, "", p); p = p + 0
            k = $0; sub(/.* over TCP socket /, "", k); k = k + 0
            e = $0; sub(/.* on rail /, "", e); sub(/ .*/, "", e)
            if (int(r / m) == int(p / m)) next
            u[e] = 1; h[int(r / m)] = 1
            if (k == 0 && e != "eth" ((r % m) % nr)) bad++ }
        END { a = 0; c = 0; for (x in u) a++; for (x in h) c++; print a, c, bad + 0 }' "$out/$name.out")
    read -r rails hosts bad0 <<<"$got"
    if [ "$rails" -ne "$want_rails" ] || [ "$hosts" -ne "$K" ] || [ "$bad0" -ne 0 ]; then
        echo "FAIL: $name: connections between hosts used $rails of $want_rails rails, from $hosts of $K hosts;" \
             "$bad0 socket-0 connections not on rail (local rank mod rails)"
        grep "connected to rank" "$out/$name.out" | head -n 20; fail=1; return
    fi
    echo "$name: $K hosts x $M ranks, $R rails: #wrong 0, all $want_rails rails carried data between hosts, rank i of a host starts on rail i mod R"
}

case $MODE in
all)
    for op in allreduce reduce_scatter allgather broadcast reduce alltoall gather scatter; do
        run "$op" -- "$op" -b 8 -e 2M -f 16 -c 1 -n 1 -w 1 -d all -o all -r -1; check "$op" $? "$R"
    done
    run nsocks2 ZCCL_NSOCKS_PERTHREAD=2 -- allreduce -b 8 -e 4M -f 8 -c 1 -n 1 -w 1 -d all -o sum; check nsocks2 $? "$R"
    if ! grep -q "$((2 * R)) sockets per direction over $R rails" "$out/nsocks2.out"; then
        echo "FAIL: nsocks2: no rank reported $((2 * R)) sockets per direction"; fail=1
    fi
    run a2a_nsocks3 ZCCL_NSOCKS_PERTHREAD=3 -- alltoall -b 8 -e 4M -f 8 -c 1 -n 1 -w 1 -d all; check a2a_nsocks3 $? "$R"
    run stripe_all ZCCL_TCP_STRIPE_MIN_BYTES=0 -- reduce_scatter -b 8 -e 1M -f 4 -c 1 -n 1 -w 1 -d all -o all
    check stripe_all $? "$R"
    ;;
badifname)
    t0=$(date +%s)
    run badifname ZCCL_SOCKET_IFNAME=nosuchif -- allreduce -b 8 -e 8 -n 1 -w 0; rc=$?
    t=$(( $(date +%s) - t0 ))
    nmsg=$(grep -c "ZCCL_SOCKET_IFNAME=nosuchif matches no up interface" "$out/badifname.out")
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$nmsg" -lt "$N" ]; then
        echo "FAIL: badifname: exit $rc after $t s, $nmsg of $N ranks named the setting"; tail -n 15 "$out/badifname.out"; fail=1
    else
        echo "badifname: every rank failed at init naming ZCCL_SOCKET_IFNAME (exit $rc, $t s)"
    fi
    ;;
subnets)
    ns=($HOSTS_NS)
    ip -n "${ns[1]}" addr del "10.200.1.2/24" dev eth1 && ip -n "${ns[1]}" addr add "10.201.1.2/24" dev eth1 || exit 1
    run subnets -- allreduce -b 8 -e 2M -f 16 -c 1 -n 1 -w 1 -d all -o all; rc=$?
    if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" "$out/subnets.out"; then
        echo "FAIL: subnets: exit $rc"; grep -v "zccl INFO" "$out/subnets.out" | tail -n 15; fail=1
    elif [ "$R" -eq 2 ] && ! grep -q "shares 1 of this rank's 2 TCP rail subnets (10.200.0.0/24 via eth0): one connection per direction" "$out/subnets.out"; then
        echo "FAIL: subnets: no rank named the fallback"; grep "rail" "$out/subnets.out" | head; fail=1
    else
        echo "subnets: a rail only one host has is left out, named at INFO; #wrong 0"
    fi
    ;;
counts)
    ns=($HOSTS_NS)
    ip -n "${ns[1]}" link del "eth$((R - 1))" || exit 1
    run counts -- allreduce -b 8 -e 2M -f 16 -c 1 -n 1 -w 1 -d all -o all; rc=$?
    if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" "$out/counts.out"; then
        echo "FAIL: counts: exit $rc"; grep -v "zccl INFO" "$out/counts.out" | tail -n 15; fail=1
    elif ! grep -q "has $((R - 1)) TCP rails and this rank $R; only the $((R - 1)) subnet" "$out/counts.out"; then
        echo "FAIL: counts: no rank named the rails in common"; grep "rail" "$out/counts.out" | head; fail=1
    else
        check counts 0 $((R - 1))
    fi
    ;;
unreachable)
    # rail 1 is in both hosts' plans, but host 1's port on its bridge is down: its lanes cannot connect there
    ip -n "$HOSTS_BRIDGE_NS" link set "$(hosts_rail_port 1 1)" down || exit 1
    run unreachable -- allreduce -b 8 -e 2M -f 16 -c 1 -n 1 -w 1 -d int32 -o all; rc=$?
    if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" "$out/unreachable.out"; then
        echo "FAIL: unreachable: exit $rc"; grep -v "zccl INFO" "$out/unreachable.out" | tail -n 15; fail=1
    elif ! grep -q "TCP rail eth1 (10.200.1.0/24) to rank [0-9]* lost" "$out/unreachable.out"; then
        echo "FAIL: unreachable: no WARN named the rail that does not connect"; grep "WARN" "$out/unreachable.out" | head; fail=1
    else
        echo "unreachable: a rail that does not connect is dropped with a WARN ($(grep -m1 -o 'lost (.*' "$out/unreachable.out" | cut -c1-90)); #wrong 0"
    fi
    ;;
*) echo "rails.sh: unknown mode '$MODE'" >&2; exit 2 ;;
esac
[ $fail -eq 0 ] && echo "rails: PASSED" || echo "rails: FAILED"
exit $fail
