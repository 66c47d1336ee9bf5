#!/bin/sh
# vm_rails.sh ZCCL_TESTS ZCCL_BENCH ZCCLRUN — runs inside the soft-RoCE VM (tests/rdma/run_vm.sh; ctest
# RDMA.soft_roce_rails): the verbs transport over two rails (HCA ports) per rank, rxe0 and rxe1 (docs/ib.md,
# "Several NICs (rails)").
#   1. the conformance matrix (tests/test_collectives.cpp) with ZCCL_IB_HCA==rxe0,rxe1 for every rank and 4 KiB
#      chunks, so transfers of the small counts stripe over both rails: "ib-rails" at 2 and 4 ranks, "ib-rails-zcopy"
#      (user buffers registered on each rail's PD) at 2, "ib-rails-mixed" (odd ranks on rxe1 only: pairs with them
#      fall back to one rail) at 3; every result checked, allreduce results bitwise equal on every rank
#   2. zccl-bench -c 1 (non-zero exit on any wrong element) for every collective, 16 B .. 1 MiB, 2 and 3 ranks on
#      both rails, ZCCL_DEBUG=INFO: every rank must log its 2 rails, start its sends on rail (rank mod 2) ("this
#      rank's first on rxeN"), and at teardown show both rails carrying data out and in ("IB rail bytes: ...")
#   3. zccl-bench allreduce -c 1, 2 ranks, rank 0 on both rails and rank 1 on rxe1 only: the pair uses one rail and
#      both ranks say so ("fallback: the smaller count"), no hang
#   4. (last: a link that was down leaves rdma_cm unreliable in the VM) 2 ranks on both rails all-reducing 1 MiB in a
#      loop, then "ip link set v1 down" (rail 1, rxe1, goes down): there is no failover between IB rails, so both
#      ranks must exit non-zero within ZCCL_TIMEOUT_MS=5000 + 30 s, each with an error naming the other rank and a
#      rail ("rxe1 port 1 (IB rail 1)"; v0 loses its carrier with its veth peer, so rxe0's port may be named) — an
#      error, never a hang
# ZCCL_RAILS_SKIP_MATRIX=1 leaves out step 1 (a quick check of the striping alone). Every zcclrun has a deadline
# (--timeout). Prints one line per step and "rails: PASSED" or "rails: FAILED"; exit
# status 0 only if all passed.
usage="usage: vm_rails.sh path/to/zccl_tests path/to/zccl-bench path/to/zcclrun"
T=${1:?$usage} BENCH=${2:?$usage} RUN=${3:?$usage}
fail=0
export ZCCL_TIMEOUT_MS=${ZCCL_TIMEOUT_MS:-60000}
now() { cut -d' ' -f1 /proc/uptime; }
step() { # name status t0 [why]
  d=$(awk -v a="$3" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$2" -eq 0 ]; then echo "rails: $1: ok ($d s)"; else echo "rails: $1: FAILED (status $2, $d s) $4"; fail=1; fi
}
ibv_devices

M='IBRails/CollectivesMatrix.EveryCollectiveTypeOpCount'
if [ "${ZCCL_RAILS_SKIP_MATRIX:-0}" != 1 ]; then
  t=$(now)
  ZT_MATRIX_SKIP_LARGE=1 "$T" \
    --gtest_filter="$M/ib_rails_2ranks:$M/ib_rails_4ranks:$M/ib_rails_zcopy_2ranks:$M/ib_rails_mixed_3ranks" \
    > /tmp/rails_matrix.out 2>&1; rc=$?
  grep -E '^\[ *(OK|FAILED|SKIPPED|INFO) *\]|Failure|FAIL' /tmp/rails_matrix.out | tail -60
  grep -q '^\[  SKIPPED' /tmp/rails_matrix.out && rc=1 # in the VM it must run
  step "matrix over 2 rails: ib-rails 2 and 4 ranks, ib-rails-zcopy 2, ib-rails-mixed 3" $rc "$t"
fi

# check_rails OUT NRANKS: every rank logged 2 rails, its first rail, and bytes out and in on both rails.
check_rails() {
  why=
  r=0
  while [ $r -lt "$2" ]; do
    grep -q "rank $r: IB rails: 2 (rxe0:1,rxe1:1)" "$1" || why="$why; rank $r did not log its 2 rails"
    first=rxe$((r % 2))
    grep "rank $r: IB connection to rank" "$1" | grep -v -q "first on $first" &&
      why="$why; rank $r does not start on $first"
    line=$(grep "rank $r: IB rail bytes:" "$1" | tail -1)
    if [ -z "$line" ]; then why="$why; rank $r logged no rail byte counts"
    elif echo "$line" | grep -qE ' 0 B (out|in)'; then why="$why; rank $r: a rail carried nothing: ${line#*bytes: }"
    fi
    r=$((r + 1))
  done
  [ -z "$why" ]
}

for n in 2 3; do
  for op in allreduce reduce_scatter allgather broadcast reduce; do
    t=$(now)
    ZCCL_TRANSPORT=ib ZCCL_IB_HCA==rxe0,rxe1 ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=IB \
      "$RUN" -n $n --timeout 150 "$BENCH" $op -b 16 -e 1M -f 16 -c 1 -n 1 -w 1 > /tmp/rails_bench.out \
      2> /tmp/rails_bench.err; rc=$?
    [ $rc -eq 0 ] || tail -40 /tmp/rails_bench.out /tmp/rails_bench.err
    why=
    if [ $rc -eq 0 ] && ! check_rails /tmp/rails_bench.err $n; then rc=1; fi
    last=$(grep -E '^ +[0-9]+ +[0-9]+ ' /tmp/rails_bench.out | tail -1 | awk '{ print $1 " B: #wrong " $9 " / " $13 }')
    grep -h "IB rail bytes:" /tmp/rails_bench.err | sed 's/^.*\(rank [0-9]*: IB rail bytes\)/  \1/'
    step "zccl-bench $op -n $n over rxe0+rxe1 (largest size $last)" $rc "$t" "$why"
  done
done

t=$(now)
ZCCL_TRANSPORT=ib ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=IB "$RUN" -n 2 --timeout 150 sh -c \
  'if [ "$RANK" = 0 ]; then ZCCL_IB_HCA==rxe0,rxe1; else ZCCL_IB_HCA==rxe1; fi; export ZCCL_IB_HCA; exec "$@"' sh \
  "$BENCH" allreduce -b 16 -e 1M -f 16 -c 1 -n 1 -w 1 > /tmp/rails_mixed.out 2>&1; rc=$?
[ $rc -eq 0 ] || tail -40 /tmp/rails_mixed.out
why=
for r in 0 1; do
  grep -q "rank $r: IB connection to rank $((1 - r)) up (1 QP" /tmp/rails_mixed.out || why="$why; rank $r: not one QP"
done
grep -q "rank 1 has 1 IB rail, this rank (0) 2 (rxe0:1,rxe1:1): the connection uses the first 1 (fallback: the smaller count)" \
  /tmp/rails_mixed.out || why="$why; rank 0 did not log the fallback"
grep -q "rank 0 has 2 IB rails, this rank (1) 1 (rxe1:1): the connection uses the first 1 (fallback" /tmp/rails_mixed.out ||
  why="$why; rank 1 did not log the fallback"
[ -n "$why" ] && [ $rc -eq 0 ] && rc=1
grep -h "fallback" /tmp/rails_mixed.out | sed 's/^/  /'
step "zccl-bench allreduce -n 2, rank 0 on 2 rails and rank 1 on 1: one rail" $rc "$t" "$why"

t=$(now)
for r in 0 1; do
  env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29700 ZCCL_SECRET=00112233445566778899aabbccddeeff \
      ZCCL_TRANSPORT=ib ZCCL_IB_HCA==rxe0,rxe1 ZCCL_TIMEOUT_MS=5000 ZCCL_INIT_TIMEOUT_MS=60000 \
      "$BENCH" allreduce -b 1M -e 1M -n 1000000 -w 1 -c 0 > /tmp/rails_down.r$r.out 2> /tmp/rails_down.r$r.err &
  eval p$r=$!
done
i=0
while [ $i -lt 600 ] && ! grep -q "out-of-place" /tmp/rails_down.r0.out 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
why=
if ! grep -q "out-of-place" /tmp/rails_down.r0.out; then
  why="the ranks did not get past init in 60 s"
else
  sleep 2
  netip link set v1 down
  t1=$(now)
  end=$(awk -v a="$t1" 'BEGIN { printf "%.1f", a + 35 }')
  while { kill -0 $p0 || kill -0 $p1; } 2>/dev/null && awk -v t="$(now)" -v e="$end" 'BEGIN { exit !(t < e) }'; do
    sleep 0.2
  done
  echo "  ranks gone $(awk -v a="$t1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s after the link went down"
fi
for r in 0 1; do
  eval pid=\$p$r
  if kill -0 $pid 2>/dev/null; then why="$why; rank $r still runs 35 s after the link went down (hang)"; kill -9 $pid; fi
  wait $pid; rc=$?
  msg=$(grep -h "zccl" /tmp/rails_down.r$r.err | grep -iv " INFO " | tail -1)
  echo "  rank $r: status $rc: $msg"
  [ $rc -ne 0 ] || why="$why; rank $r exited 0"
  echo "$msg" | grep -q "rank $((1 - r))" || why="$why; rank $r's error does not name rank $((1 - r))"
  echo "$msg" | grep -qE "rxe[01] port 1 \(IB rail [01]\)" || why="$why; rank $r's error does not name a rail"
done
netip link set v1 up
rc=0; [ -n "$why" ] && rc=1
step "rail 1 (v1) down under traffic: both ranks fail naming the rail (no failover), no hang" $rc "$t" "$why"

[ $fail -eq 0 ] && echo "rails: PASSED" || echo "rails: FAILED"
exit $fail
