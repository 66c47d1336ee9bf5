#!/usr/bin/env bash
# ib_conformance.sh — the IB verbs transport's device tests, inside the soft-RoCE VM of tests/rdma/run_vm.sh:
# conformance suite over ZCCL_TRANSPORT=ib (2-4 ranks, all collectives), killed peer and downed link (errors, not
# hangs), zccl-bench's result check over IB. Exit status: the guest's (77 = skipped, no VM possible here).
# Usage: tests/rdma/ib_conformance.sh BUILD_DIR [extra run_vm.sh options]
# ZCCL_IB_SUITES (gtest filters, space-separated) and ZCCL_IB_BENCH_OPS (zccl-bench operations) narrow the run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
b=$(cd "${1:?usage: ib_conformance.sh BUILD_DIR}" && pwd); shift
exec "$here/run_vm.sh" --timeout 1500 --bin "$b/tests/zccl_tests" --bin "$b/tools/zcclrun" --bin "$b/tools/zccl-bench" \
  --bin "$b/libzccl.so" --file "$here/ib_guest.sh" "$@" -- \
  sh -c "ZCCL_IB_SUITES='${ZCCL_IB_SUITES:-}' ZCCL_IB_BENCH_OPS='${ZCCL_IB_BENCH_OPS:-}' sh $here/ib_guest.sh $b"
