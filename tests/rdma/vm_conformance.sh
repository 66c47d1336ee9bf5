#!/bin/sh
# vm_conformance.sh ZCCL_TESTS ZCCL_BENCH ZCCLRUN — runs inside the soft-RoCE VM (tests/rdma/run_vm.sh; ctest
# RDMA.soft_roce_conformance): zccl's collectives over the verbs transport (ZCCL_TRANSPORT=ib) on rxe0 and rxe1.
#   1. the IB instantiations of the conformance matrix (tests/test_collectives.cpp): every collective, 10 datatypes,
#      5 ops, counts {0,1,2,7,1023}, in-/out-of-place, every root, send/recv shifts, barrier, inexact sums, each
#      result checked against the rank's own reference; variant "ib" for 2 and 4 ranks, "ib-qp2" (2 QPs per
#      connection, 4 KiB chunks) for 3 ranks, "ib-zcopy" (user buffers registered, no staging) for 2 ranks. The
#      test alternates ranks between rxe0 and rxe1 (ZCCL_VM_DEV0/1), so traffic both crosses the veth pair and
#      loops back inside one device. Count 1000003 is skipped (ZT_MATRIX_SKIP_LARGE): under emulation its
#      references alone take minutes; large transfers are covered by step 2.
#   2. zccl-bench with its element check (-c 1: non-zero exit on any wrong element) for every collective, sizes
#      16 B .. 1 MiB, 3 and 4 ranks under zcclrun, even ranks on rxe0 and odd ranks on rxe1 (rank_hca.sh): with 4
#      every ring neighbour pair crosses the veth pair, with 3 the pair (2, 0) shares rxe0
#   3. IbFaults.RankThatGivesUpMakesItsPeerFail (below)
# The subset keeps the run to a few minutes of emulation (about 6 min on a busy 2-core host, 8.5 min with every
# variant at 2, 3 and 4 ranks and zccl-bench at 2 ranks too).
# Prints one line per step and "conformance: PASSED" or "conformance: FAILED"; exit status 0 only if all passed.
usage="usage: vm_conformance.sh path/to/zccl_tests path/to/zccl-bench path/to/zcclrun"
T=${1:?$usage} BENCH=${2:?$usage} RUN=${3:?$usage}
here=$(dirname "$0")
fail=0
export ZCCL_TIMEOUT_MS=${ZCCL_TIMEOUT_MS:-60000}
now() { cut -d' ' -f1 /proc/uptime; }
step() { # name status t0
  d=$(awk -v a="$3" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$2" -eq 0 ]; then echo "conformance: $1: ok ($d s)"; else echo "conformance: $1: FAILED (status $2, $d s)"; fail=1; fi
}
ibv_devices

M='IB/CollectivesMatrix.EveryCollectiveTypeOpCount'
t=$(now)
ZT_MATRIX_SKIP_LARGE=1 "$T" --gtest_filter="$M/ib_2ranks:$M/ib_4ranks:$M/ib_qp2_3ranks:$M/ib_zcopy_2ranks" \
  > /tmp/matrix.out 2>&1; rc=$?
grep -E '^\[ *(OK|FAILED|SKIPPED|INFO) *\]|Failure|FAIL' /tmp/matrix.out | tail -60
step "matrix: ib 2 and 4 ranks, ib-qp2 3 ranks, ib-zcopy 2 ranks" $rc "$t"

for n in 3 4; do
  for op in allreduce reduce_scatter allgather broadcast reduce; do
    t=$(now)
    ZCCL_TRANSPORT=ib "$RUN" -n $n --timeout 150 sh "$here/rank_hca.sh" "$BENCH" $op -b 16 -e 1M -f 16 -c 1 -n 1 -w 1 \
      > /tmp/bench.out 2>&1; rc=$?
    [ $rc -eq 0 ] || cat /tmp/bench.out
    last=$(grep -E '^ +[0-9]+ +[0-9]+ ' /tmp/bench.out | tail -1 | awk '{ print $1 " B: #wrong " $9 " / " $13 }')
    step "zccl-bench $op -n $n (rxe0/rxe1; largest size $last)" $rc "$t"
  done
done

# 3. a rank that gives up (its own ZCCL_TIMEOUT_MS) and stays alive disconnects its connections (the poison op):
#    the peer waiting on it fails within seconds (tests/test_ib.cpp; the other IbFaults run in ctest's faults step
#    and tests/rdma/ib_conformance.sh)
t=$(now)
"$T" --gtest_filter='IbFaults.RankThatGivesUpMakesItsPeerFail' > /tmp/giveup.out 2>&1; rc=$?
grep -E '^\[ *(OK|FAILED|SKIPPED|INFO) *\]|Failure' /tmp/giveup.out | tail -20
grep -q '^\[  SKIPPED' /tmp/giveup.out && rc=1 # in the VM it must run
step "a rank that gives up makes its peer fail (poison op)" $rc "$t"

[ $fail -eq 0 ] && echo "conformance: PASSED" || echo "conformance: FAILED"
exit $fail
