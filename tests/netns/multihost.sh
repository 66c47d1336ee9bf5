#!/usr/bin/env bash
# multihost.sh ZCCLRUN ZCCL_BENCH K M [RATE] — every collective across K simulated hosts (network namespaces joined
# by a bridge, tests/netns/hosts.sh) with M ranks each, started by `zcclrun --hostfile`. zccl-bench -c 1 checks every
# output element against values it computes itself for all datatypes and ops (-d all -o all) and exits non-zero
# if one is wrong. With ZCCL_DEBUG=INFO the ranks log each TCP connection; the test also checks that every rank
# connected over TCP to a rank on another host, i.e. that the hosts really talked through the bridge and not through
# shared memory. zcclrun --timeout is each run's deadline. Prints "multihost: PASSED" at the end.
# Needs root and iproute2; otherwise prints SKIP and exits 77.
set -u
RUN=${1:?usage: multihost.sh ZCCLRUN ZCCL_BENCH K M [RATE]}
BENCH=${2:?usage: multihost.sh ZCCLRUN ZCCL_BENCH K M [RATE]}
K=${3:?K hosts}
M=${4:?M ranks per host}
RATE=${5:-}
DEADLINE=${MULTIHOST_DEADLINE_S:-300}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"

hosts_scratch out || exit 1
hosts_up "$K" "$RATE"; rc=$?
[ $rc -eq 0 ] || exit $rc
hosts_hostfile "$M" "$out/hostfile" || exit 1
N=$((K * M))
fail=0
# Placement: rank r on host r/M (hostname = its namespace, its own interface), LOCAL_RANK r%M, LOCAL_WORLD_SIZE M.
got=$("$RUN" --hostfile "$out/hostfile" --timeout "$DEADLINE" sh -c \
      'echo "$RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE $(hostname) $(ip -4 -o addr show dev eth0 | awk "{print \$4}")"' 2>&1 | sort -n)
want=$(for ((r = 0; r < N; r++)); do h=$((r / M)); echo "$r $((r % M)) $M $N ${HOST_NS[$h]} ${HOST_ADDR[$h]}/24"; done)
if [ "$got" != "$want" ]; then
    echo "FAIL: placement of ranks on hosts: got"; echo "$got"; echo "expected"; echo "$want"; fail=1
else
    echo "placement: $N ranks, rank r on host r/$M with LOCAL_RANK r%$M, hostname and eth0 address of its namespace"
fi
for op in allreduce reduce_scatter allgather broadcast reduce; do
    t0=$(date +%s.%N)
    ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=TCP "$RUN" --hostfile "$out/hostfile" --timeout "$DEADLINE" --tag-output \
        "$BENCH" "$op" -b 8 -e 1M -f 32 -c 1 -n 1 -w 1 -d all -o all -r -1 >"$out/$op.out" 2>&1
    rc=$?
    t=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ $rc -ne 0 ]; then
        echo "FAIL: $op on $K hosts x $M ranks: exit status $rc after $t s$([ $rc = 124 ] && echo " (deadline $DEADLINE s)")"
        grep -v "connected to rank" "$out/$op.out" | tail -n 15
        fail=1
        continue
    fi
    rows=$(grep -c -E '^\[0\] +[0-9]+ ' "$out/$op.out")
    if [ "$rows" -lt 1 ]; then
        echo "FAIL: $op: no result rows in zccl-bench's output"; tail -n 15 "$out/$op.out"; fail=1; continue
    fi
    # Which ranks each rank connected to over TCP ("[r] ... connected to rank p over TCP"): with K >= 2 every rank
    # must have at least one peer on another host (ring and direct schedules cross hosts from every rank).
    cross=$(awk -v m="$M" -v n="$N" '
        match($0, /^\[[0-9]+\]/) && /connected to rank [0-9]+ over TCP/ {
            r = substr($0, 2, RLENGTH - 2) + 0
            p = $0; sub(/.*connected to rank /, "", p); p = p + 0
            if (int(r / m) != int(p / m)) x[r] = 1 }
        END { c = 0; for (r = 0; r < n; r++) c += (r in x); print c }' "$out/$op.out")
    if [ "$K" -ge 2 ] && [ "$cross" -ne "$N" ]; then
        echo "FAIL: $op: only $cross of $N ranks connected over TCP to a rank on another host"; fail=1; continue
    fi
    echo "$op: $K hosts x $M ranks, $rows sizes x all types/ops checked, #wrong 0, $cross/$N ranks crossed hosts over TCP, $t s"
done
[ $fail -eq 0 ] && echo "multihost: PASSED" || echo "multihost: FAILED"
exit $fail
