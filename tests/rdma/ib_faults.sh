#!/bin/sh
# ib_faults.sh ZCCL_BENCH — runs inside the soft-RoCE VM (tests/rdma/run_vm.sh; ctest RDMA.soft_roce_faults): two
# ranks of zccl-bench all-reducing 1 MiB in a loop over the verbs transport, rank 0 on rxe0 and rank 1 on rxe1 (the
# QPs cross the veth pair), then one fault:
#   killed_peer  rank 1 is killed (SIGKILL): rank 0 must exit non-zero with an error that names rank 1
#   link_down    "ip link set v0 down" (rxe0's port goes down): both ranks must exit non-zero, each naming the other
# within ZCCL_TIMEOUT_MS (default here 5000) plus a margin for the emulated CPU (ZCCL_FAULT_MARGIN_S, default 20 s)
# — an error, never a hang.
# Prints "ib_faults: PASSED" or "ib_faults: FAILED"; exit status 0 only if both scenarios behaved.
BENCH=${1:?usage: ib_faults.sh path/to/zccl-bench}
TMO=${ZCCL_TIMEOUT_MS:-5000}
# Margin for the emulated CPUs: on an idle 2-core host both faults are reported within 1.5-2.5 s. (They took 26-105 s
# until queued stream operations behind a transport error stopped running one by one: zccl-bench queues all its
# iterations, and a port error is a system error, which did not yet mark the communicator broken.)
MARGIN=${ZCCL_FAULT_MARGIN_S:-20}
out=/tmp/ib_faults
mkdir -p $out
fail=0
port=29600
now() { cut -d' ' -f1 /proc/uptime; }

start_ranks() { # scenario
  port=$((port + 1))
  for r in 0 1; do
    dev=rxe$r
    env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZCCL_SECRET=00112233445566778899aabbccddeeff \
        ZCCL_TRANSPORT=ib ZCCL_IB_HCA==$dev ZCCL_TIMEOUT_MS=$TMO ZCCL_INIT_TIMEOUT_MS=60000 \
        "$BENCH" allreduce -b 1M -e 1M -n 1000000 -w 1 -c 0 > $out/$1.r$r.out 2> $out/$1.r$r.err &
    eval p$r=$!
  done
  # The benchmark prints its table header once init (bootstrap, rdma_cm connections, probe write) is done.
  i=0
  while [ $i -lt 600 ] && ! grep -q "out-of-place" $out/$1.r0.out 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
  if ! grep -q "out-of-place" $out/$1.r0.out; then
    echo "ib_faults: $1: FAILED: the ranks did not get past init in 60 s"; cat $out/$1.r*.err
    kill -9 $p0 $p1 2>/dev/null; fail=1; return 1
  fi
  sleep 2   # a few all-reduces in flight
}

# wait_gone SCENARIO PID...: every PID must exit within TMO/1000 + MARGIN seconds of the fault (guest clock; a
# polling loop's own count would stretch with the emulated CPU). Also prints when each rank first reported an error
# on stderr (a line naming a failure) and when it exited, seconds after the fault.
wait_gone() {
  s=$1; shift
  t0=$(now)
  limit=$((TMO / 1000 + MARGIN))
  end=$(awk -v a="$t0" -v l="$limit" 'BEGIN { printf "%.1f", a + l }')
  seen0= seen1= gone0= gone1=
  while :; do
    t=$(now)
    alive=0
    for r in 0 1; do
      eval pid=\$p$r seen=\$seen$r gone=\$gone$r
      [ -z "$seen" ] && grep -qiE 'fail|error' $out/$s.r$r.err 2>/dev/null && eval seen$r=$t
      if echo " $* " | grep -q " $pid "; then
        if kill -0 $pid 2>/dev/null; then alive=1; elif [ -z "$gone" ]; then eval gone$r=$t; fi
      fi
    done
    [ $alive = 0 ] && break
    awk -v t="$t" -v e="$end" 'BEGIN { exit !(t >= e) }' && break
    sleep 0.2
  done
  for r in 0 1; do
    eval seen=\$seen$r gone=\$gone$r
    [ -n "$seen$gone" ] && echo "ib_faults: $s: rank $r: error reported after $(awk -v a="$t0" -v b="${seen:-$t0}" \
      'BEGIN { printf "%.1f", b - a }') s, exited after $(awk -v a="$t0" -v b="${gone:-$t0}" 'BEGIN { printf "%.1f", b - a }') s"
  done
  for p in "$@"; do
    if kill -0 $p 2>/dev/null; then
      echo "ib_faults: $s: FAILED: a rank (pid $p) still runs $limit s after the fault (hang)"; kill -9 $p; fail=1
    fi
  done
}

# check_rank SCENARIO RANK PID: the rank exited non-zero and its last zccl error line names the other rank.
check_rank() {
  wait $3; rc=$?
  other=$((1 - $2))
  msg=$(grep -h "zccl" $out/$1.r$2.err | grep -iv " INFO " | tail -1)
  if [ $rc -eq 0 ]; then echo "ib_faults: $1: FAILED: rank $2 exited 0"; fail=1
  elif ! echo "$msg" | grep -q "rank $other"; then
    echo "ib_faults: $1: FAILED: rank $2's error (status $rc) does not name rank $other: $msg"; fail=1
  else echo "ib_faults: $1: rank $2: status $rc: $msg"; fi
}

echo "ib_faults: killed_peer: start"
if start_ranks killed_peer; then
  kill -9 $p1
  wait_gone killed_peer $p0
  wait $p1 2>/dev/null
  check_rank killed_peer 0 $p0
fi

echo "ib_faults: link_down: start"
if start_ranks link_down; then
  netip link set v0 down
  wait_gone link_down $p0 $p1
  check_rank link_down 0 $p0
  check_rank link_down 1 $p1
  netip link set v0 up
fi

[ $fail -eq 0 ] && echo "ib_faults: PASSED" || echo "ib_faults: FAILED"
exit $fail
