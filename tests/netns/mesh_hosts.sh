#!/usr/bin/env bash
# mesh_hosts.sh ZCCLRUN MESH_CHECK — the mesh (include/zccl_mesh.h) on 2 simulated hosts (tests/netns/hosts.sh) x 4
# ranks: dp=2 x tp=4 keeps every tp group on one host and puts every dp group across both (examples/mesh_check.c
# checks members, hostnames and an all-reduce per group on every rank); dp=1 x tp=8, whose tp group would span the
# hosts, and dp=3 x tp=3, which does not multiply to 8, are refused on every rank naming the shape. zcclrun --timeout
# is each run's deadline. Prints "mesh_hosts: PASSED". Needs root and iproute2; otherwise SKIP and exit 77.
set -u
RUN=${1:?usage: mesh_hosts.sh ZCCLRUN MESH_CHECK}
CHECK=${2:?usage: mesh_hosts.sh ZCCLRUN MESH_CHECK}
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_scratch out || exit 1
hosts_up 2; rc=$?
[ $rc -eq 0 ] || exit $rc
hosts_hostfile 4 "$out/hostfile" || exit 1
fail=0
run() { # WANT_LINES PATTERN ARGS...
    local want=$1 pat=$2; shift 2
    MESH_DP_ACROSS=1 "$RUN" --hostfile "$out/hostfile" --timeout 120 "$CHECK" "$@" >"$out/log" 2>&1
    local got; got=$(grep -c -- "$pat" "$out/log")
    if [ "$got" -ne "$want" ]; then
        echo "FAIL: mesh_check $*: $got of $want ranks printed '$pat'"; tail -n 20 "$out/log"; fail=1
    else
        echo "mesh_check $*: $got ranks: $pat"; grep -m 2 -e "group of" -e "refused" "$out/log"
    fi
}
run 8 "mesh_check: OK" 2 4
run 8 "refused as expected: .*dp=1 x tp=8 would put the tp group .*across hosts" 1 8 refuse
run 8 "refused as expected: .*dp=3 x tp=3 has 9 ranks" 3 3 refuse
[ $fail -eq 0 ] && echo "mesh_hosts: PASSED"
exit $fail
