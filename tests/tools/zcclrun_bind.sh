#!/usr/bin/env bash
# zcclrun_bind.sh ZCCLRUN — the CPUs each rank may run on, as the rank itself reads them (Cpus_allowed_list of its
# /proc/self/status) with its ZCCL_LOCAL_BIND, under zcclrun's default binding, --bind none, --bind core (also
# oversubscribed) and a bad --bind value; then with --hostfile across network namespaces, where the ranks of all
# the hosts on this machine are counted together. The machine's topology is replaced by hwloc's synthetic "core:2 pu:1" (HWLOC_SYNTHETIC, with
# HWLOC_THISSYSTEM=1 so that the binding applies to this machine): core i is CPU i whatever the machine, so the
# expected lists follow from the core count (2) alone, and an unbound rank's list is this script's own.
# Needs CPUs 0 and 1 in this script's affinity (else SKIP, 77); the --hostfile part needs root and iproute2 (else
# it is skipped, and said so). Every zcclrun call has --timeout. Prints "zcclrun_bind: PASSED" at the end.
set -u
RUN=${1:?usage: zcclrun_bind.sh ZCCLRUN}
python3 -c 'import os, sys; sys.exit(0 if {0, 1} <= os.sched_getaffinity(0) else 1)' ||
    { echo "SKIP: CPUs 0 and 1 are not both in this process's affinity mask"; exit 77; }
export HWLOC_SYNTHETIC="core:2 pu:1" HWLOC_THISSYSTEM=1
unset ZCCL_DEBUG NCCL_DEBUG ZCCL_MACHINE_RANKS
mine=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
out=$(mktemp -d)
fail=0
show='echo "$RANK $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status) $ZCCL_LOCAL_BIND"'

# check NAME WANT ARGS...: runs zcclrun ARGS... with the child above; its sorted stdout must be WANT.
check() {
    local name=$1 want=$2
    shift 2
    local got
    got=$("$RUN" --timeout 30 "$@" sh -c "$show" 2>"$out/err" | sort -n)
    if [ "$got" != "$want" ]; then
        echo "FAIL: $name: ranks saw"; echo "$got"; echo "expected"; echo "$want"; cat "$out/err"; fail=1
    else
        echo "ok: $name"
    fi
}
# unbound N: the lines of N ranks that kept this script's mask.
unbound() { for ((r = 0; r < $1; r++)); do echo "$r $mine none"; done; }
# stderr_has NAME TEXT: the last zcclrun call's stderr must contain TEXT.
stderr_has() {
    if ! grep -qF -- "$2" "$out/err"; then
        echo "FAIL: $1: stderr lacks '$2':"; cat "$out/err"; fail=1
    fi
}

check "default, 2 ranks on 2 cores: rank i on CPU i" "$(printf '0 0 core\n1 1 core')" -n 2
ZCCL_DEBUG=INFO check "default, 3 ranks on 2 cores: unbound" "$(unbound 3)" -n 3
stderr_has "default, 3 ranks" "INFO: 3 ranks on this host but 2 cores: the ranks are not bound"
ZCCL_DEBUG=INFO check "default, 1 rank" "0 0 core" -n 1
stderr_has "default, 1 rank" "INFO: 1 rank on this host, 2 cores: local rank i bound to core i"
check "--bind none, 2 ranks" "$(unbound 2)" -n 2 --bind none
check "--bind core, 3 ranks on 2 cores: i mod 2" "$(printf '0 0 core\n1 1 core\n2 0 core')" -n 3 --bind core
stderr_has "--bind core, 3 ranks" "3 ranks on a host but only 2 cores: cores are oversubscribed"
check "--bind=none --report-bindings" "$(unbound 2)" -n 2 --bind=none --report-bindings
stderr_has "--report-bindings" "rank 1 not bound (PUs 0-1)"

"$RUN" -n 2 --bind sockets true >"$out/bad" 2>&1
rc=$?
if [ $rc -ne 2 ] || ! grep -qF "zcclrun: --bind: 'sockets' is not one of core, numa, package, none" "$out/bad"; then
    echo "FAIL: --bind sockets: exit status $rc (want 2), output:"; cat "$out/bad"; fail=1
else
    echo "ok: --bind sockets refused (status 2, names the value)"
fi

# --hostfile: the network-namespace hosts all run on this machine, so zcclrun counts their ranks together against
# its cores. Hosts of 2, 3 and 1 ranks: 6 ranks on 2 cores, none bound by default; --bind core binds this machine's
# rank i (over all hosts) to core i mod 2. Two hosts of 1 rank each fit: one on each core (before 2026-12-07 each
# host's ranks were numbered from 0, so both landed on core 0).
HOSTS_NO_TRAP=1
source "$(dirname "${BASH_SOURCE[0]}")/../netns/hosts.sh"
trap 'hosts_down; rm -rf "$out"' EXIT
hosts_up 3 >"$out/up" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    printf 'netns:%s slots=2\nnetns:%s slots=3\nnetns:%s slots=1\n' "${HOST_NS[@]}" >"$out/hostfile"
    want=$(printf '0 %s none\n1 %s none\n2 %s none\n3 %s none\n4 %s none\n5 %s none' "$mine" "$mine" "$mine" "$mine" \
        "$mine" "$mine")
    ZCCL_DEBUG=INFO check "--hostfile 2+3+1 ranks, default: 6 on this machine, unbound" "$want" --hostfile "$out/hostfile"
    stderr_has "--hostfile default" "INFO: 3 ranks on host netns:${HOST_NS[1]}; 6 ranks on this machine, whose hosts share its cores, but 2 cores: the ranks are not bound"
    stderr_has "--hostfile default, 1-rank host" "INFO: 1 rank on host netns:${HOST_NS[2]}; 6 ranks on this machine"
    want=$(printf '0 0 core\n1 1 core\n2 0 core\n3 1 core\n4 0 core\n5 1 core')
    check "--hostfile 2+3+1 ranks, --bind core: this machine's rank i mod 2" "$want" --hostfile "$out/hostfile" --bind core
    stderr_has "--hostfile --bind core" "6 ranks on this machine but only 2 cores: cores are oversubscribed"
    check "--hostfile 2+3+1 slots, -n 2: the 2 ranks fit" "$(printf '0 0 core\n1 1 core')" --hostfile "$out/hostfile" -n 2
    printf 'netns:%s slots=1\nnetns:%s slots=1\n' "${HOST_NS[0]}" "${HOST_NS[1]}" >"$out/hostfile2"
    ZCCL_DEBUG=INFO check "--hostfile 1+1 ranks, default: one core each" "$(printf '0 0 core\n1 1 core')" \
        --hostfile "$out/hostfile2"
    stderr_has "--hostfile 1+1 default" "INFO: 1 rank on host netns:${HOST_NS[1]} (2 on this machine, whose hosts share its cores), 2 cores: this machine's rank i bound to core i"
    got=$("$RUN" --timeout 30 --hostfile "$out/hostfile2" sh -c 'echo "$RANK $ZCCL_MACHINE_RANKS"' 2>"$out/err" | sort -n)
    if [ "$got" != "$(printf '0 2\n1 2')" ]; then
        echo "FAIL: --hostfile 1+1: ZCCL_MACHINE_RANKS: ranks saw"; echo "$got"; cat "$out/err"; fail=1
    else
        echo "ok: --hostfile 1+1: every rank has ZCCL_MACHINE_RANKS=2"
    fi
elif [ $rc -eq 77 ]; then
    echo "skipped the --hostfile part: $(cat "$out/up")"
else
    echo "FAIL: could not create the network namespaces:"; cat "$out/up"; fail=1
fi
[ $fail -eq 0 ] || exit 1
echo "zcclrun_bind: PASSED"
