#!/usr/bin/env bash
# gloo_check.sh ZCCLRUN GLOO_BENCH — bench/gloo_bench (the Gloo column of bench/compare's multi-host mode) across 2
# namespace hosts x 2 ranks: every collective with -c 1, which compares every output element with values it computes
# itself and exits 1 if one is wrong. Makes sure the peer being compared against computes the right thing across the
# simulated hosts. zcclrun --timeout is the deadline. Needs root and iproute2; otherwise SKIP, exit 77.
set -u
RUN=${1:?usage: gloo_check.sh ZCCLRUN GLOO_BENCH}
GB=${2:?usage: gloo_check.sh ZCCLRUN GLOO_BENCH}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_scratch store || exit 1
hosts_up 2; rc=$?
[ $rc -eq 0 ] || exit $rc
hosts_hostfile 2 "$store/hostfile" || exit 1
fail=0
for op in allreduce reduce_scatter allgather; do
    out=$(GLOO_STORE_DIR=$store "$RUN" --hostfile "$store/hostfile" --timeout 120 "$GB" "$op" -b 64 -e 256K -f 8 \
          -n 1 -w 1 -c 1 2>&1)
    rc=$?
    if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
        echo "FAIL: gloo_bench $op across 2 hosts x 2 ranks: exit status $rc"; tail -n 8 <<<"$out"; fail=1
    else
        echo "gloo_bench $op: $(grep -c -E '^ +[0-9]+ ' <<<"$out") sizes, #wrong 0"
    fi
done
[ $fail -eq 0 ] && echo "gloo_check: PASSED" || echo "gloo_check: FAILED"
exit $fail
