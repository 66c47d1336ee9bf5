#!/usr/bin/env bash
# rail_loss.sh ZCCLRUN ZCCL_BENCH MODE [TRIALS] — losing a TCP rail mid-job (issue 23). 2 hosts x M ranks (M = 1,
# RAIL_LOSS_M), 2 rails of RAIL_LOSS_RATE each (tests/netns/hosts.sh --rails 2 --rate), zccl-bench running checked
# all-reduces in a loop (-c: every call's output compared element by element with values it computes itself); at
# a random moment of each trial host 0's rail 1 is cut:
#   down   its veth set down (ip link set eth1 down)
#   addr   its address removed (ip addr del)
#   both   rail 1 cut, then rail 0 too: the job must fail (not hang) within RAIL_LOSS_BOUND_S, naming both rails
#   two    3 rails; rail 1's veth set down, then 1 s later rail 2's: two losses in a row, the job must finish on rail 0
#          with every result right, a WARN naming each lost rail and both listed as lost at the end
# For down/addr every trial must finish with every result right (#wrong 0, exit 0), one WARN naming the rail
# ("TCP rail eth1 (10.200.1.0/24) to rank P lost (why)"), and the rails at the end listing eth1 as lost with
# zccl_comm_get_async_error still SUCCESS (zccl-bench's last lines). zcclrun
# --timeout is each trial's deadline. RAIL_LOSS_KEEP=FILE copies the last trial's log there. Prints "rail_loss:
# PASSED" at the end. Needs root and iproute2 (tc for the
# rate); otherwise prints SKIP and exits 77. Longer runs: bench/rail_loss_trials (20 trials per fault kind).
set -u
RUN=${1:?usage: rail_loss.sh ZCCLRUN ZCCL_BENCH down|addr|both|two [TRIALS]}
BENCH=${2:?usage: rail_loss.sh ZCCLRUN ZCCL_BENCH down|addr|both|two [TRIALS]}
MODE=${3:?mode: down, addr, both or two}
NR=2; [ "$MODE" = two ] && NR=3
TRIALS=${4:-2}
M=${RAIL_LOSS_M:-1}
RATE=${RAIL_LOSS_RATE:-300mbit}
CHECKS=${RAIL_LOSS_CHECKS:-60}
DEADLINE=${RAIL_LOSS_DEADLINE_S:-120}
BOUND=${RAIL_LOSS_BOUND_S:-60}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"

hosts_scratch out || exit 1
fail=0
for ((t = 1; t <= TRIALS; t++)); do
    hosts_up 2 "$RATE" "$NR"; rc=$?
    [ $rc -eq 0 ] || exit $rc
    hosts_hostfile "$M" "$out/hostfile" || exit 1
    ns=($HOSTS_NS)
    log=$out/trial$t.out
    t0=$(date +%s.%N)
    ZCCL_DEBUG=${RAIL_LOSS_DEBUG:-WARN} ZCCL_DEBUG_SUBSYS=TCP "$RUN" --hostfile "$out/hostfile" --timeout "$DEADLINE" --tag-output "$BENCH" allreduce \
        -b 2M -e 2M -n 1 -w 1 -c "$CHECKS" -d int32 -o sum >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do grep -q "out-of-place" "$log" 2>/dev/null && break; sleep 0.1; done
    delay=$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.3 + rand() * 2.5 }')
    sleep "$delay"
    case $MODE in
        down) ip -n "${ns[0]}" link set eth1 down ;;
        addr) ip -n "${ns[0]}" addr del 10.200.1.1/24 dev eth1 ;;
        both) ip -n "${ns[0]}" link set eth1 down; sleep 1; ip -n "${ns[0]}" link set eth0 down ;;
        two) ip -n "${ns[0]}" link set eth1 down; sleep 1; ip -n "${ns[0]}" link set eth2 down ;;
    esac
    t_cut=$(date +%s.%N)
    wait "$pid"; rc=$?
    t_end=$(date +%s.%N)
    [ -n "${RAIL_LOSS_KEEP:-}" ] && cp "$log" "$RAIL_LOSS_KEEP"
    secs=$(awk -v a="$t_cut" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }')
    if [ "$MODE" = both ]; then
        if [ $rc -eq 0 ] || [ $rc -eq 124 ] || awk -v s="$secs" -v b="$BOUND" 'BEGIN { exit !(s > b) }'; then
            echo "FAIL: trial $t ($MODE after $delay s): exit $rc $secs s after the cut (bound $BOUND s)"; tail -n 12 "$log"; fail=1
        elif ! grep -q "lost every TCP rail to rank" "$log" || ! grep -q "eth0" "$log" || ! grep "lost every TCP rail" "$log" | grep -q "eth1"; then
            echo "FAIL: trial $t ($MODE): no error naming both rails"; grep -i "zccl" "$log" | tail -n 8; fail=1
        else
            echo "trial $t ($MODE after $delay s): failed in $secs s with: $(grep -m1 -o 'lost every TCP rail.*' "$log")"
        fi
    elif [ "$MODE" = two ]; then
        w1=$(grep -c "TCP rail eth1 (10.200.1.0/24) to rank [0-9]* lost" "$log")
        w2=$(grep -c "TCP rail eth2 (10.200.2.0/24) to rank [0-9]* lost" "$log")
        end=$(grep -m1 "Rails at the end (rank 0):" "$log")
        if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" "$log"; then
            echo "FAIL: trial $t ($MODE after $delay s): exit $rc$([ $rc = 124 ] && echo " (deadline $DEADLINE s: hang)")"
            grep -v "^\[.\] *[0-9]" "$log" | tail -n 15; fail=1
        elif [ "$w1" -lt 1 ] || [ "$w2" -lt 1 ]; then
            echo "FAIL: trial $t ($MODE): WARNs naming eth1: $w1, eth2: $w2 (both must be named)"; tail -n 8 "$log"; fail=1
        elif ! echo "$end" | grep -q "eth1" || ! echo "$end" | grep -q "eth2" || ! echo "$end" | grep -q "async error: SUCCESS"; then
            echo "FAIL: trial $t ($MODE): the rails at the end do not show eth1 and eth2 lost with no async error: $end"; fail=1
        else
            echo "trial $t ($MODE after $delay s): $CHECKS checked all-reduces, #wrong 0, WARNs naming eth1 ($w1) and eth2 ($w2), done $secs s after the second cut; at the end: ${end#*: }"
        fi
    else
        warns=$(grep -c "TCP rail eth1 (10.200.1.0/24) to rank [0-9]* lost" "$log")
        if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" "$log"; then
            echo "FAIL: trial $t ($MODE after $delay s): exit $rc$([ $rc = 124 ] && echo " (deadline $DEADLINE s: hang)")"
            grep -v "^\[.\] *[0-9]" "$log" | tail -n 15; fail=1
        elif [ "$warns" -lt 1 ]; then
            echo "FAIL: trial $t ($MODE after $delay s): the job survived but no WARN named rail eth1"; tail -n 8 "$log"; fail=1
        elif ! grep -q "Rails at the end (rank 0):.*(eth1 lost); async error: SUCCESS" "$log"; then
            echo "FAIL: trial $t ($MODE): the rails at the end do not show eth1 lost with no async error"
            grep "Rails at the end" "$log"; fail=1
        else
            echo "trial $t ($MODE after $delay s): $CHECKS checked all-reduces, #wrong 0, $warns WARN naming eth1, done $secs s after the cut: $(grep -m1 -o 'lost (.*' "$log")"
        fi
    fi
    hosts_down
done
[ $fail -eq 0 ] && echo "rail_loss: PASSED" || echo "rail_loss: FAILED"
exit $fail
