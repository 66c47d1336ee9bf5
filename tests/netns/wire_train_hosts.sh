#!/usr/bin/env bash
# wire_train_hosts.sh ZCCLRUN ZERO_TRAIN [PYTHON] — ZeRO++-style training across 2 simulated hosts
# (tests/netns/hosts.sh) x 2 ranks, with the bytes that leave each host per step *measured* on its link: the tx_bytes
# counter of its veth, read inside its namespace before and after each job (every frame that crosses, headers and
# acknowledgements included). A job's start costs megabytes that have nothing to do with its steps (the launcher,
# the rendezvous, the tuner's calibration at communicator creation, more for the hierarchical calls' two
# sub-communicators), so each configuration runs twice, short and long, and a step's bytes are the difference
# divided by the difference in steps:
#   1. examples/zero_train --stage 3 at full precision, then with --wire int8 --weight-wire int8 (qgZ + qwZ) and,
#      when zero_train has --hpz, with --hpz added: each quantized run's held-out accuracy within 0.5 points of full
#      precision's, its cross-host bytes per optimizer step at least 3x fewer.
#   2. With PYTHON (a python3 that imports torch and zccl_torch: PYTHONPATH must reach build/bindings/torch/python):
#      bindings/torch/tests/ddp_hosts_job.py, DDP without a hook, then with zccl_torch.quantized_allreduce_hook at
#      int8 through the hierarchical all-reduce (--hier): accuracy within 0.5 points, cross-host bytes per step at least
#      3x fewer, replicas bitwise equal.
# Prints one line per run (bytes per step per host, the ratio, accuracy) and "wire_train_hosts: PASSED". zcclrun
# --timeout is each job's deadline. Needs root and iproute2, and the digits set (../shared, the cache, or Debian's
# archive for examples/zero_train/fetch_digits.sh); otherwise SKIP and exit 77.
set -u
RUN=${1:?usage: wire_train_hosts.sh ZCCLRUN ZERO_TRAIN [PYTHON]}
ZT=${2:?usage: wire_train_hosts.sh ZCCLRUN ZERO_TRAIN [PYTHON]}
PY=${3:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/hosts.sh"
hosts_scratch out || exit 1
hosts_up 2; rc=$?
[ $rc -eq 0 ] || exit $rc
hosts_hostfile 2 "$out/hostfile" || exit 1
fail=0

tx_sum() { # bytes sent so far by both hosts on their links
    local t=0 ns v
    for ns in "${HOST_NS[@]}"; do
        v=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes) || return 1
        t=$((t + v))
    done
    echo "$t"
}

# run NAME STEPS_EXPR -- COMMAND...: runs the job on the hosts; sets BYTES (sent by both hosts) and LOG.
run_job() {
    local name=$1; shift
    local before after
    LOG=$out/$name.log
    before=$(tx_sum) || return 1
    env -u ZCCL_HOST_ID "$RUN" --hostfile "$out/hostfile" --timeout 300 "$@" >"$LOG" 2>&1
    local rc=$?
    after=$(tx_sum) || return 1
    BYTES=$((after - before))
    return $rc
}

field() { grep -o "$1=[^ ]*" "$2" | tail -n 1 | cut -d= -f2; }

# ---- 1. zero_train stage 3 ----
variants=("full:" "int8:--wire int8 --weight-wire int8")
"$ZT" --help 2>&1 | grep -q -- "--hpz" && variants+=("int8_hpz:--wire int8 --weight-wire int8 --hpz")
full_bps= full_acc=
for v in "${variants[@]}"; do
    name=${v%%:*}; flags=${v#*:}
    # shellcheck disable=SC2086
    if ! run_job "zero_${name}_short" "$ZT" --stage 3 --epochs 1 $flags; then
        if grep -q "could not fetch the digits set" "$LOG"; then # no ../shared, and Debian's archive unreachable
            echo "wire_train_hosts: SKIP: zero_train has no data set:"; grep -E "could not fetch|failed" "$LOG" | head -n 3; exit 77
        fi
        echo "FAIL: zero_train --stage 3 --epochs 1 $flags: exit status, log:"; tail -n 15 "$LOG"; fail=1; continue
    fi
    short=$BYTES
    # shellcheck disable=SC2086
    if ! run_job "zero_$name" "$ZT" --stage 3 --epochs 12 $flags; then
        echo "FAIL: zero_train --stage 3 $flags: exit status, log:"; tail -n 15 "$LOG"; fail=1; continue
    fi
    acc=$(field accuracy "$LOG")
    spe=$(grep -o "[0-9]* steps per epoch" "$LOG" | cut -d' ' -f1)
    if [ -z "$acc" ] || [ -z "$spe" ] || [ "$(grep -c "^epoch " "$LOG")" -ne 12 ]; then
        echo "FAIL: zero_train $flags: no final line, log:"; tail -n 15 "$LOG"; fail=1; continue
    fi
    bps=$(((BYTES - short) / (spe * 11) / 2))
    if [ "$name" = full ]; then
        full_bps=$bps; full_acc=$acc
        echo "zero_train stage 3 full: $bps bytes per step leaving each host (measured), accuracy $acc"
        continue
    fi
    ratio=$(awk -v f="$full_bps" -v b="$bps" 'BEGIN { printf "%.2f", f / b }')
    verdict=$(awk -v a="$acc" -v f="$full_acc" -v r="$ratio" 'BEGIN { print (a >= f - 0.005 && r >= 3) ? "ok" : "bad" }')
    echo "zero_train stage 3 $flags: $bps bytes per step leaving each host (measured), ${ratio}x fewer than full," \
         "accuracy $acc (full $full_acc)"
    if [ "$verdict" != ok ]; then
        echo "FAIL: zero_train $flags: needs accuracy >= full - 0.005 and >= 3x fewer cross-host bytes"; fail=1
    fi
done

# ---- 2. DDP with the quantized hook ----
if [ -z "$PY" ]; then
    echo "wire_train_hosts: DDP part not run (no PYTHON given)"
elif ! "$PY" -c "import torch, zccl_torch" 2>/dev/null; then
    echo "wire_train_hosts: DDP part skipped: $PY cannot import torch and zccl_torch (PYTHONPATH=${PYTHONPATH:-})"
else
    JOB=$HERE/../../bindings/torch/tests/ddp_hosts_job.py
    full_bps= full_acc=
    for v in "none:" "int8_hier:--wire int8 --hier"; do
        name=${v%%:*}; flags=${v#*:}
        # shellcheck disable=SC2086
        if ! run_job "ddp_${name}_short" "$PY" "$JOB" --steps 1 $flags; then
            echo "FAIL: ddp_hosts_job --steps 1 $flags: exit status, log:"; tail -n 15 "$LOG"; fail=1; continue
        fi
        short=$BYTES
        # shellcheck disable=SC2086
        if ! run_job "ddp_$name" "$PY" "$JOB" --steps 301 $flags; then
            echo "FAIL: ddp_hosts_job $flags: exit status, log:"; tail -n 15 "$LOG"; fail=1; continue
        fi
        if grep -q "ddp_hosts: SKIP" "$LOG"; then grep "ddp_hosts: SKIP" "$LOG"; break; fi
        acc=$(field heldout_accuracy "$LOG"); eq=$(field replicas_equal "$LOG")
        if [ -z "$acc" ] || [ "$eq" != 1 ]; then
            echo "FAIL: ddp_hosts_job $flags: replicas differ or no result, log:"; tail -n 15 "$LOG"; fail=1; continue
        fi
        bps=$(((BYTES - short) / 300 / 2))
        if [ "$name" = none ]; then
            full_bps=$bps; full_acc=$acc
            echo "DDP full precision: $bps bytes per step leaving each host (measured), accuracy $acc"
            continue
        fi
        ratio=$(awk -v f="$full_bps" -v b="$bps" 'BEGIN { printf "%.2f", f / b }')
        verdict=$(awk -v a="$acc" -v f="$full_acc" -v r="$ratio" \
                      'BEGIN { print (a >= f - 0.005 && r >= 3) ? "ok" : "bad" }')
        echo "DDP quantized_allreduce_hook $flags: $bps bytes per step leaving each host (measured), ${ratio}x fewer," \
             "accuracy $acc (full $full_acc), replicas bitwise equal"
        if [ "$verdict" != ok ]; then
            echo "FAIL: DDP hook $flags: needs accuracy >= full - 0.005 and >= 3x fewer cross-host bytes"; fail=1
        fi
    done
fi
[ $fail -eq 0 ] && echo "wire_train_hosts: PASSED"
exit $fail
