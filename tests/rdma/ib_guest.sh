#!/bin/sh
# ib_guest.sh — runs inside the soft-RoCE VM (started by tests/rdma/ib_conformance.sh): the conformance suite over
# ZCCL_TRANSPORT=ib for 2-4 ranks (ranks alternate between rxe0 and rxe1, so traffic crosses the veth pair and
# also loops back inside one device), the failure tests (a killed peer, a downed link: errors, not hangs), and
# zccl-bench's own result check over IB for every collective up to 4 MiB (many chunks and grants per transfer).
# Usage: sh ib_guest.sh BUILD_DIR. Exit status 0 when everything passed.
b=$1
fail=0
export ZCCL_TEST_VERBOSE=${ZCCL_TEST_VERBOSE:-0}
"$b/tests/zccl_tests" --gtest_filter="${ZCCL_IB_GTEST_FILTER:-IB/*:Ib*}" > /tmp/gt.out 2>&1 || fail=1
grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED|INFO) *\]|Failure|rank [0-9]+:|FAIL' /tmp/gt.out | tail -150
for op in allreduce reduce_scatter allgather broadcast reduce; do
  if ZCCL_TRANSPORT=ib "$b/tools/zcclrun" -n 3 --timeout 300 "$b/tools/zccl-bench" $op -b 8 -e 4M -f 16 -c 1 -n 1 -w 1 \
      > /tmp/bench_$op.out 2>&1; then
    echo "ib_guest: zccl-bench $op over IB: checked, 0 wrong"
  else
    echo "ib_guest: zccl-bench $op over IB FAILED"; cat /tmp/bench_$op.out; fail=1
  fi
done
cat /tmp/bench_allreduce.out
echo "ib_guest: $( [ $fail = 0 ] && echo PASSED || echo FAILED )"
exit $fail
