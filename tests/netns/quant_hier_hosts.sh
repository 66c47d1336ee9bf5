#!/usr/bin/env bash
# quant_hier_hosts.sh ZCCLRUN ZCCL_BENCH — the hierarchical quantized collectives (include/zccl_hier.h) on 2 simulated
# hosts (tests/netns/hosts.sh) x 2 ranks with the real host identity (each netns host is its own UTS namespace, so
# hostnames differ; no ZCCL_HOST_ID): zccl-bench --wire hier:int8 runs allreduce, reduce_scatter and allgather, and
# every rank's INFO line must say the layout is 2 hosts of 2 ranks (not the flat fallback). The results themselves
# are checked against their bounds by tests/test_quant_hier.cpp. zcclrun --timeout is each run's deadline. Prints
# "quant_hier_hosts: PASSED". Needs root and iproute2; otherwise SKIP and exit 77.
set -u
RUN=${1:?usage: quant_hier_hosts.sh ZCCLRUN ZCCL_BENCH}
BENCH=${2:?usage: quant_hier_hosts.sh ZCCLRUN ZCCL_BENCH}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_scratch out || exit 1
hosts_up 2; rc=$?
[ $rc -eq 0 ] || exit $rc
hosts_hostfile 2 "$out/hostfile" || exit 1
fail=0
for op in allreduce reduce_scatter allgather; do
    env -u ZCCL_HOST_ID ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=COLL "$RUN" --hostfile "$out/hostfile" --timeout 120 \
        "$BENCH" "$op" --wire hier:int8 -b 64K -e 4M -f 8 -n 2 -w 1 -d float -o sum >"$out/log" 2>&1
    rc=$?
    got=$(grep -c "2 hosts of 2 ranks: this rank is local rank" "$out/log")
    if [ $rc -ne 0 ] || [ "$got" -ne 4 ] || ! grep -q "Out of bounds values : 0 OK" "$out/log"; then
        echo "FAIL: zccl-bench $op --wire hier:int8: exit $rc, $got of 4 ranks in the hierarchical layout"
        tail -n 20 "$out/log"; fail=1
    else
        echo "zccl-bench $op --wire hier:int8: 4 ranks as 2 hosts of 2"
    fi
done
[ $fail -eq 0 ] && echo "quant_hier_hosts: PASSED"
exit $fail
