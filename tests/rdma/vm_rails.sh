#!/bin/sh
# vm_rails.sh ZCCL_TESTS ZCCL_BENCH ZCCLRUN — runs inside the soft-RoCE VM (tests/rdma/run_vm.sh; ctest
# RDMA.soft_roce_rails): the verbs transport over two rails (HCA ports) per rank, rxe0 and rxe1 (docs/ib.md,
# "Several NICs (rails)").
#   1. the conformance matrix (tests/test_collectives.cpp) with ZCCL_IB_HCA==rxe0,rxe1 for every rank and 4 KiB
#      chunks, so transfers of the small counts stripe over both rails: "ib-rails" at 2 and 4 ranks, "ib-rails-zcopy"
#      (user buffers registered on each rail's PD) at 2, "ib-rails-mixed" (odd ranks on rxe1 only: pairs with them
#      fall back to one rail) at 3; every result checked, allreduce results bitwise equal on every rank
#   2. zccl-bench -c 1 (non-zero exit on any wrong element) for every collective, 16 B .. 1 MiB, 2 and 3 ranks on
#      both rails, ZCCL_DEBUG=INFO: every rank must log its 2 rails, start its sends on rail (rank mod 2) ("this
#      rank's first on rxeN"), and at teardown show both rails carrying data out and in ("IB rail bytes: ...")
#   3. zccl-bench allreduce -c 1, 2 ranks, rank 0 on both rails and rank 1 on rxe1 only: the pair uses one rail and
#      both ranks say so ("fallback: the smaller count"), no hang
#   3b. GPU-paired rails (with FAKE and TOPO): rank 0 on =rxe0,rxe2 and rank 1 on =rxe1,rxe3, device buffers of the
#      fake CUDA driver, ZCCL_TOPO_FILE=gpu-rails.xml placing rank 0's GPU next to rxe2/rxe3 and rank 1's next to
#      rxe0/rxe1: rank 0 must start its sends on rxe2 and rank 1 on rxe1 (rank order alone: rxe0 and rxe3, checked
#      with host buffers in the same run), every result checked
#   4. failover (rank 0 on rxe0,rxe2 and rank 1 on rxe1,rxe3: rail 0 over the veth pair v0/v1, rail 1 over v2/v3):
#      "ip link set v3 down" at a random moment while the ranks run checked all-reduces: every result correct, both
#      exit 0, each warns once naming the rail, the peer and the live rail, and lists its live rails at the end;
#      zccl_comm_get_async_error stays SUCCESS and zccl_comm_net_info lists the live IB rails (zccl-bench's "# Rails
#      at the end" line);
#      ZCCL_RAILS_FO_TRIALS (5) trials, v2/v3 rebuilt after each
#   4b. three rails (a third veth pair v4/v5 with rxe4/rxe5, built for this step only): rail 1 (v3) down at a random
#      moment and rail 2 (v5) a second later under checked all-reduces: every result correct, both exit 0, one
#      warning per lost rail with the live ones, the pair ends on rail 0 alone
#   5. (last: a link that was down leaves rdma_cm unreliable in the VM) both rails down under traffic: both ranks
#      must exit non-zero within ZCCL_TIMEOUT_MS=5000 + 30 s, each with an error naming the other rank and a rail —
#      an error, never a hang
# ZCCL_RAILS_SKIP_MATRIX=1 leaves out step 1, ZCCL_RAILS_SKIP_STRIPING=1 steps 2 and 3 (quick checks);
# ZCCL_RAILS_FO_TRIALS (5) and ZCCL_RAILS_FO_CHECKS (60) size step 4. Every zcclrun has a deadline (--timeout).
# Prints one line per step and "rails: PASSED" or "rails: FAILED"; exit status 0 only if all passed.
usage="usage: vm_rails.sh path/to/zccl_tests path/to/zccl-bench path/to/zcclrun [path/to/libzccl_fake_cuda.so path/to/gpu-rails.xml]"
T=${1:?$usage} BENCH=${2:?$usage} RUN=${3:?$usage} FAKE=${4:-} TOPO=${5:-}
fail=0
export ZCCL_TIMEOUT_MS=${ZCCL_TIMEOUT_MS:-60000}
now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; } # seconds since uptime $1
step() { # name status t0 [why]
  d=$(since "$3")
  if [ "$2" -eq 0 ]; then echo "rails: $1: ok ($d s)"; else echo "rails: $1: FAILED (status $2, $d s) $4"; fail=1; fi
}
ibv_devices

M='IBRails/CollectivesMatrix.EveryCollectiveTypeOpCount'
if [ "${ZCCL_RAILS_SKIP_MATRIX:-0}" != 1 ]; then
  t=$(now)
  ZT_MATRIX_SKIP_LARGE=1 "$T" \
    --gtest_filter="$M/ib_rails_2ranks:$M/ib_rails_4ranks:$M/ib_rails_zcopy_2ranks:$M/ib_rails_mixed_3ranks" \
    > /tmp/rails_matrix.out 2>&1; rc=$?
  grep -E '^\[ *(OK|FAILED|SKIPPED|INFO) *\]|Failure|FAIL' /tmp/rails_matrix.out | tail -60
  grep -q '^\[  SKIPPED' /tmp/rails_matrix.out && rc=1 # in the VM it must run
  step "matrix over 2 rails: ib-rails 2 and 4 ranks, ib-rails-zcopy 2, ib-rails-mixed 3" $rc "$t"
fi

# check_rails OUT NRANKS: every rank logged 2 rails, its first rail, and bytes out and in on both rails.
check_rails() {
  why=
  r=0
  while [ $r -lt "$2" ]; do
    grep -q "rank $r: IB rails: 2 (rxe0:1,rxe1:1)" "$1" || why="$why; rank $r did not log its 2 rails"
    first=rxe$((r % 2))
    grep "rank $r: IB connection to rank" "$1" | grep -v -q "first on $first" &&
      why="$why; rank $r does not start on $first"
    line=$(grep "rank $r: IB rail bytes:" "$1" | tail -1)
    if [ -z "$line" ]; then why="$why; rank $r logged no rail byte counts"
    elif echo "$line" | grep -qE ' 0 B (out|in)'; then why="$why; rank $r: a rail carried nothing: ${line#*bytes: }"
    fi
    r=$((r + 1))
  done
  [ -z "$why" ]
}

if [ "${ZCCL_RAILS_SKIP_STRIPING:-0}" != 1 ]; then
for n in 2 3; do
  for op in allreduce reduce_scatter allgather broadcast reduce; do
    t=$(now)
    ZCCL_TRANSPORT=ib ZCCL_IB_HCA==rxe0,rxe1 ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=IB \
      "$RUN" -n $n --timeout 150 "$BENCH" $op -b 16 -e 1M -f 16 -c 1 -n 1 -w 1 > /tmp/rails_bench.out \
      2> /tmp/rails_bench.err; rc=$?
    [ $rc -eq 0 ] || tail -40 /tmp/rails_bench.out /tmp/rails_bench.err
    why=
    if [ $rc -eq 0 ] && ! check_rails /tmp/rails_bench.err $n; then rc=1; fi
    last=$(grep -E '^ +[0-9]+ +[0-9]+ ' /tmp/rails_bench.out | tail -1 | awk '{ print $1 " B: #wrong " $9 " / " $13 }')
    grep -h "IB rail bytes:" /tmp/rails_bench.err | sed 's/^.*\(rank [0-9]*: IB rail bytes\)/  \1/'
    step "zccl-bench $op -n $n over rxe0+rxe1 (largest size $last)" $rc "$t" "$why"
  done
done

t=$(now)
ZCCL_TRANSPORT=ib ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=IB "$RUN" -n 2 --timeout 150 sh -c \
  'if [ "$RANK" = 0 ]; then ZCCL_IB_HCA==rxe0,rxe1; else ZCCL_IB_HCA==rxe1; fi; export ZCCL_IB_HCA; exec "$@"' sh \
  "$BENCH" allreduce -b 16 -e 1M -f 16 -c 1 -n 1 -w 1 > /tmp/rails_mixed.out 2>&1; rc=$?
[ $rc -eq 0 ] || tail -40 /tmp/rails_mixed.out
why=
for r in 0 1; do
  grep -q "rank $r: IB connection to rank $((1 - r)) up (1 QP" /tmp/rails_mixed.out || why="$why; rank $r: not one QP"
done
grep -q "rank 1 has 1 IB rail, this rank (0) 2 (rxe0:1,rxe1:1): the connection uses the first 1 (fallback: the smaller count)" \
  /tmp/rails_mixed.out || why="$why; rank 0 did not log the fallback"
grep -q "rank 0 has 2 IB rails, this rank (1) 1 (rxe1:1): the connection uses the first 1 (fallback" /tmp/rails_mixed.out ||
  why="$why; rank 1 did not log the fallback"
[ -n "$why" ] && [ $rc -eq 0 ] && rc=1
grep -h "fallback" /tmp/rails_mixed.out | sed 's/^/  /'
step "zccl-bench allreduce -n 2, rank 0 on 2 rails and rank 1 on 1: one rail" $rc "$t" "$why"
fi

# 3b. GPU-paired rails: each rank starts on the rail next to its GPU (the topology's pairing), not at rank order.
if [ -n "$FAKE" ] && [ -n "$TOPO" ]; then
  t=$(now)
  why=
  for dev in 1 0; do
    ZCCL_TRANSPORT=ib ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=IB,TOPO ZCCL_CUDA_LIBRARY=$FAKE ZCCL_TOPO_FILE=$TOPO \
      "$RUN" -n 2 --timeout 150 sh -c 'if [ "$RANK" = 0 ]; then ZCCL_IB_HCA==rxe0,rxe2 FAKE_CUDA_PCI_BUSID=0000:02:00.0
        else ZCCL_IB_HCA==rxe1,rxe3 FAKE_CUDA_PCI_BUSID=0000:01:00.0; fi; export ZCCL_IB_HCA FAKE_CUDA_PCI_BUSID
        exec "$@"' sh "$BENCH" allreduce -D $dev -b 16 -e 1M -f 16 -c 1 -n 1 -w 1 > /tmp/rails_gpu.$dev.out 2>&1 ||
      why="$why; -D $dev: zcclrun exited $?: $(grep -v ' INFO ' /tmp/rails_gpu.$dev.out | tail -2)"
    grep -E '^ +[0-9]+ +[0-9]+ ' /tmp/rails_gpu.$dev.out | awk '$9 != 0 || $13 != 0 { bad = 1 } END { exit bad }' ||
      why="$why; -D $dev: wrong results"
    if [ $dev = 1 ]; then want0=rxe2 want1=rxe1; else want0=rxe0 want1=rxe3; fi
    for r in 0 1; do
      eval want=\$want$r
      line=$(grep "rank $r: IB connection to rank $((1 - r)) up" /tmp/rails_gpu.$dev.out)
      echo "  -D $dev: rank $r: ${line#*up }"
      echo "$line" | grep -q "this rank's first on $want\$" || why="$why; -D $dev: rank $r does not start on $want"
    done
    [ $dev = 0 ] || grep -h "pairs with NIC\|the rail paired" /tmp/rails_gpu.1.out | sed 's/^.*zccl INFO /  -D 1: /' | cut -c1-200
  done
  grep -q "rank 0: CUDA device 0 (PCI 0000:02:00.0) pairs with NIC rxe2,rxe3" /tmp/rails_gpu.1.out ||
    why="$why; rank 0 did not log its GPU's NIC"
  rc=0; [ -n "$why" ] && { rc=1; tail -30 /tmp/rails_gpu.1.out; }
  step "GPU-paired rails: rank 0 (GPU by rxe2) starts on rxe2, rank 1 (GPU by rxe1) on rxe1; rank order without GPUs" $rc "$t" "$why"
fi

# Failover: rank 0 on rxe0,rxe2 and rank 1 on rxe1,rxe3, so rail 0 is the veth pair v0/v1 and rail 1 the pair
# v2/v3, which fail separately. pair_job TAG EXTRA_ENV... starts both ranks of a checked all-reduce loop in the
# background (pids in p0 p1, output in /tmp/fo.TAG.r{0,1}.{out,err}) and waits until they are past init.
# The ranks' HCA lists are FO_HCA0 and FO_HCA1; CHECKS (default FO_CHECKS) sets the number of checked all-reduces.
FO_CHECKS=${ZCCL_RAILS_FO_CHECKS:-60}
FO_HCA0==rxe0,rxe2 FO_HCA1==rxe1,rxe3
port=29700
pair_job() {
  tag=$1; shift
  checks=${CHECKS:-$FO_CHECKS}
  port=$((port + 1))
  for r in 0 1; do
    if [ $r = 0 ]; then hca=$FO_HCA0; else hca=$FO_HCA1; fi
    env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZCCL_SECRET=00112233445566778899aabbccddeeff \
        ZCCL_TRANSPORT=ib ZCCL_IB_HCA=$hca ZCCL_TIMEOUT_MS=5000 ZCCL_INIT_TIMEOUT_MS=60000 ZCCL_CHUNK_BYTES=16384 \
        ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=IB "$@" \
        "$BENCH" allreduce -b 256K -e 256K -c $checks -n 1 -w 0 > /tmp/fo.$tag.r$r.out 2> /tmp/fo.$tag.r$r.err &
    eval p$r=$!
  done
  i=0
  while [ $i -lt 600 ] && ! grep -q "IB connection to rank 1 up" /tmp/fo.$tag.r0.err 2>/dev/null; do
    sleep 0.1; i=$((i + 1))
  done
  grep -q "IB connection to rank 1 up" /tmp/fo.$tag.r0.err
}
# wait_pair LIMIT_S: waits until both ranks exited or LIMIT_S passed; kills a rank still running (a hang) and sets
# s0 s1 to the exit statuses (137 for a killed rank).
wait_pair() {
  t1=$(now)
  end=$(awk -v a="$t1" -v l="$1" 'BEGIN { printf "%.1f", a + l }')
  while { kill -0 $p0 || kill -0 $p1; } 2>/dev/null && awk -v t="$(now)" -v e="$end" 'BEGIN { exit !(t < e) }'; do
    sleep 0.2
  done
  for r in 0 1; do
    eval pid=\$p$r
    kill -0 $pid 2>/dev/null && { echo "  rank $r still runs $1 s later: killed (hang)"; kill -9 $pid; }
    wait $pid; eval s$r=$?
  done
}

# job_checks TAG: what every failover job must show (appended to $why): both ranks exited 0 (s0 s1 from wait_pair),
# rank 0 printed its result lines with no wrong element, and zccl_comm_get_async_error stayed SUCCESS.
job_checks() {
  for r in 0 1; do
    eval st=\$s$r
    [ "$st" = 0 ] || why="$why; rank $r exited $st: $(grep -h zccl /tmp/fo.$1.r$r.err | grep -v ' INFO ' | tail -1)"
  done
  grep -qE '^ +[0-9]+ +[0-9]+ ' /tmp/fo.$1.r0.out || why="$why; rank 0 printed no result line"
  grep -q "async error: SUCCESS" /tmp/fo.$1.r0.out || why="$why; zccl_comm_get_async_error is not SUCCESS at the end"
  grep -E '^ +[0-9]+ +[0-9]+ ' /tmp/fo.$1.r0.out | awk '$9 != 0 || $13 != 0 { bad = 1 } END { exit bad }' ||
    why="$why; wrong results: $(grep -E '^ +[0-9]+ +[0-9]+ ' /tmp/fo.$1.r0.out | tail -1)"
}

# 4. rail 1 (v3) set down at a random moment while 2 ranks all-reduce and check every result: every result correct,
# both ranks exit 0, each says at WARN which rail it lost and to whom, and at the end which rails remain; repeated
# with the veth pair v2/v3 built afresh each time (sh /init pair2), trials 4 and 5 with registered user buffers
trials=${ZCCL_RAILS_FO_TRIALS:-5}
n=1
while [ $n -le "$trials" ]; do
  t=$(now)
  why=
  extra=ZCCL_IB_ZCOPY_BYTES=0
  [ $n -ge 4 ] && extra=ZCCL_IB_ZCOPY_BYTES=1
  if ! pair_job t$n $extra; then
    why="the ranks did not get past init in 60 s"
    kill -9 $p0 $p1 2>/dev/null
    wait_pair 1
  else
    delay=$(awk -v s="$n$(cut -d. -f2 /proc/uptime)" 'BEGIN { srand(s); printf "%.1f", 0.3 + rand() * 2.5 }')
    sleep "$delay"
    kill -0 $p0 2>/dev/null || why="$why; rank 0 finished before the link went down ($delay s): raise ZCCL_RAILS_FO_CHECKS"
    netip link set v3 down
    td=$(now)
    wait_pair 150
    echo "  trial $n: v3 down $delay s after init; ranks done $(since "$td") s later, status $s0 $s1 ($extra)"
    job_checks t$n
    for r in 0 1; do
      w=$(grep "rank $r: IB rail rxe$((2 + r)) port 1 (rail 1) to rank $((1 - r)) lost (" /tmp/fo.t$n.r$r.err)
      [ -n "$w" ] || why="$why; rank $r did not warn that rail 1 (rxe$((2 + r))) to rank $((1 - r)) was lost"
      echo "$w" | grep -q "live rails to rank $((1 - r)): rxe$r:1\$" || why="$why; rank $r's warning lacks its live rail"
      [ "$(echo "$w" | grep -c .)" -le 1 ] || why="$why; rank $r warned more than once"
      echo "  rank $r: ${w#*WARN }" | cut -c1-300
      e=$(grep "rank $r: IB rails to rank $((1 - r)) at the end: live rxe$r:1 (lost rxe$((2 + r)):1)" /tmp/fo.t$n.r$r.err)
      [ -n "$e" ] || why="$why; rank $r did not list its live rails at the end"
      echo "  rank $r: ${e#*rank $r: }"
      late=$(grep -c "after its grant again: ignored" /tmp/fo.t$n.r$r.err)
      [ "$late" = 0 ] || echo "  rank $r: $late first grant(s) read after their grant again, ignored"
    done
    grep -q "^# Rails at the end (rank 0): no peer over TCP (ib: IB rails rxe0:1,rxe2:1; to rank 1 live rxe0:1 (lost rxe2:1))" \
      /tmp/fo.t$n.r0.out || why="$why; zccl_comm_net_info does not list the live IB rails: $(grep '^# Rails at the end' /tmp/fo.t$n.r0.out)"
  fi
  [ -n "$why" ] && { tail -15 /tmp/fo.t$n.r0.err /tmp/fo.t$n.r1.err /tmp/fo.t$n.r0.out; }
  rc=0; [ -n "$why" ] && rc=1
  sh /init pair2 || { rc=1; why="$why; rebuilding v2/v3 failed"; }
  step "failover trial $n: rail 1 (v3) down under checked all-reduces: correct results, exit 0, warned" $rc "$t" "$why"
  n=$((n + 1))
done

# 4b. three rails, two lost one after the other (rank 0 on rxe0,rxe2,rxe4 and rank 1 on rxe1,rxe3,rxe5; the third
# veth pair v4/v5 is built for this step only): v3 down at a random moment, v5 down a second later, while the ranks
# run checked all-reduces: every result correct, both exit 0, each warns once per lost rail (rail 1 with rails 0
# and 2 live, then rail 2 with rail 0 live), and ends on rail 0 alone
t=$(now)
why=
if ! sh /init pair3; then
  why="building the third veth pair (v4/v5, rxe4/rxe5) failed"
elif ! { FO_HCA0==rxe0,rxe2,rxe4; FO_HCA1==rxe1,rxe3,rxe5; CHECKS=$((FO_CHECKS * 2)); pair_job three ZCCL_IB_ZCOPY_BYTES=0; }; then
  why="the ranks did not get past init in 60 s"
  kill -9 $p0 $p1 2>/dev/null
  wait_pair 1
else
  delay=$(awk -v s="$(cut -d. -f2 /proc/uptime)" 'BEGIN { srand(s); printf "%.1f", 0.3 + rand() * 1.5 }')
  sleep "$delay"
  netip link set v3 down
  sleep 1
  kill -0 $p0 2>/dev/null || why="$why; rank 0 finished before the second link went down: raise ZCCL_RAILS_FO_CHECKS"
  netip link set v5 down
  td=$(now)
  wait_pair 150
  echo "  v3 down $delay s after init, v5 a second later; ranks done $(since "$td") s after that, status $s0 $s1"
  job_checks three
  for r in 0 1; do
    o=$((1 - r))
    w1=$(grep "rank $r: IB rail rxe$((2 + r)) port 1 (rail 1) to rank $o lost (" /tmp/fo.three.r$r.err)
    w2=$(grep "rank $r: IB rail rxe$((4 + r)) port 1 (rail 2) to rank $o lost (" /tmp/fo.three.r$r.err)
    [ "$(echo "$w1" | grep -c .)" = 1 ] || why="$why; rank $r did not warn exactly once that rail 1 (rxe$((2 + r))) was lost"
    [ "$(echo "$w2" | grep -c .)" = 1 ] || why="$why; rank $r did not warn exactly once that rail 2 (rxe$((4 + r))) was lost"
    echo "$w1" | grep -q "live rails to rank $o: rxe$r:1,rxe$((4 + r)):1\$" ||
      why="$why; rank $r's first warning does not list rails 0 and 2 as live"
    echo "$w2" | grep -q "live rails to rank $o: rxe$r:1\$" || why="$why; rank $r's second warning does not list rail 0 alone"
    echo "  rank $r: ${w1#*WARN }" | cut -c1-300
    echo "  rank $r: ${w2#*WARN }" | cut -c1-300
    e=$(grep "rank $r: IB rails to rank $o at the end: live rxe$r:1 (lost rxe$((2 + r)):1,rxe$((4 + r)):1)" /tmp/fo.three.r$r.err)
    [ -n "$e" ] || why="$why; rank $r did not end on rail 0 alone: $(grep 'at the end' /tmp/fo.three.r$r.err)"
    echo "  rank $r: ${e#*rank $r: }"
  done
fi
[ -n "$why" ] && { tail -15 /tmp/fo.three.r0.err /tmp/fo.three.r1.err /tmp/fo.three.r0.out; }
FO_HCA0==rxe0,rxe2; FO_HCA1==rxe1,rxe3; CHECKS=
sh /init nopair3
sh /init pair2 || why="$why; rebuilding v2/v3 failed"
rc=0; [ -n "$why" ] && rc=1
step "three rails, rail 1 (v3) and then rail 2 (v5) down under checked all-reduces: correct results, exit 0, warned twice" $rc "$t" "$why"

# 5. (last: a link that was down leaves rdma_cm unreliable in the VM) both rails down (v1 and v3) under traffic: both
# ranks must exit non-zero within ZCCL_TIMEOUT_MS=5000 + 30 s, each with an error naming the other rank and a rail
# ("rxeN port 1 (IB rail K)") — an error, never a hang
t=$(now)
why=
if ! pair_job down; then
  why="the ranks did not get past init in 60 s"
  kill -9 $p0 $p1 2>/dev/null
  wait_pair 1
else
  sleep 1
  netip link set v1 down
  netip link set v3 down
  td=$(now)
  wait_pair 35
  echo "  ranks gone $(since "$td") s after both links went down"
  for r in 0 1; do
    eval st=\$s$r
    msg=$(grep -h "zccl" /tmp/fo.down.r$r.err | grep -v " INFO " | grep -v "to rank $((1 - r)) lost (" | tail -1)
    echo "  rank $r: status $st: $msg" | cut -c1-400
    [ "$st" != 0 ] || why="$why; rank $r exited 0"
    [ "$st" != 137 ] || why="$why; rank $r hung"
    echo "$msg" | grep -q "rank $((1 - r))" || why="$why; rank $r's error does not name rank $((1 - r))"
    echo "$msg" | grep -qE "rxe[0-3] port 1 \(IB rail [01]\)" || why="$why; rank $r's error does not name a rail"
  done
fi
netip link set v1 up
netip link set v3 up
rc=0; [ -n "$why" ] && rc=1
step "both rails (v1, v3) down under traffic: both ranks fail naming the peer and a rail, no hang" $rc "$t" "$why"

[ $fail -eq 0 ] && echo "rails: PASSED" || echo "rails: FAILED"
exit $fail
