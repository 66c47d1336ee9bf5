#!/bin/sh
# ib_guest.sh — runs inside the soft-RoCE VM (started by tests/rdma/ib_conformance.sh): the failure tests (a killed
# peer, a downed link: errors, not hangs), the conformance suite over ZCCL_TRANSPORT=ib for 2-4 ranks (ranks
# alternate between rxe0 and rxe1, so traffic crosses the veth pair and also loops back inside one device), and
# zccl-bench's own result check over IB up to 4 MiB (many chunks and grants per transfer). Output is streamed.
# The bench runs first and the failure tests last: after the downed-link test the guest's network is restored
# (link, routes, neighbours) well enough for traffic across the pair, but rdma_cm connections that loop back
# inside one rxe device were seen to time out afterwards.
# Usage: sh ib_guest.sh BUILD_DIR. ZCCL_IB_SUITES (space-separated gtest filters) and ZCCL_IB_BENCH_OPS override
# what runs. Exit status 0 when everything passed.
b=$1
fail=0
suites=${ZCCL_IB_SUITES:-"IB/*/ib_2ranks IB/*/ib_3ranks IB/*/ib_qp2_2ranks IB/*/ib_zcopy_2ranks IB/*/ib_4ranks IbFaults.*"}
ops=${ZCCL_IB_BENCH_OPS:-"allreduce reduce_scatter allgather broadcast reduce"}
[ "$suites" = "-" ] && suites=""   # "-": run none
[ "$ops" = "-" ] && ops=""
for op in $ops; do
  if ZCCL_TRANSPORT=ib "$b/tools/zcclrun" -n 3 --timeout 300 "$b/tools/zccl-bench" $op -b 8 -e 4M -f 64 -c 1 -n 1 \
      -w 0 > /tmp/bench_$op.out 2>&1; then
    echo "ib_guest: zccl-bench $op over IB (3 ranks, 8 B - 4 MiB, checked): ok"
    grep -E '^ +[0-9]+ ' /tmp/bench_$op.out | tail -3
  else
    echo "ib_guest: zccl-bench $op over IB FAILED"; tail -20 /tmp/bench_$op.out; fail=1
  fi
done
for f in $suites; do
  echo "ib_guest: --- $f"
  if "$b/tests/zccl_tests" --gtest_filter="$f" > /tmp/gt.out 2>&1; then r=ok; else r=FAILED; fail=1; fi
  grep -E '^\[ *(OK|FAILED|SKIPPED|INFO) *\]|Failure|rank [0-9]+:|FAIL|failed' /tmp/gt.out | head -40
  echo "ib_guest: $f $r"
done
echo "ib_guest: $( [ $fail = 0 ] && echo PASSED || echo FAILED )"
exit $fail
