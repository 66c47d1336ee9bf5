#!/bin/sh
# vm_gdr.sh ZCCL_BENCH ZCCLRUN FAKE_CUDA — runs inside the soft-RoCE VM (tests/rdma/run_vm.sh; ctest
# RDMA.soft_roce_gdr; issue 24): the GPUDirect RDMA data path with the fake CUDA driver, whose device memory is host
# memory. rxe has no dma-buf, so ZCCL_GDR_FAKE_PEERMEM=1 (test only) makes zccl act as if the peer-memory module were
# loaded: fake device buffers are registered with ibv_reg_mr and the NIC reads and writes them directly.
#   - every collective of zccl-bench (-D 1 -c 1: every element checked against the reference it computes) at 2, 3
#     and 4 ranks on rxe0/rxe1 (rank_hca.sh), float32 / int32 / float64 with sum, prod, max, min, avg (the fake
#     driver's reduction kernels), bfloat16 where nothing is reduced, ZCCL_GDR=1 and
#     auto: every device call must be named "path gdr" with 0 host staging copies;
#   - FAKE_CUDA_CC=80 (Ampere): calls flush (every all-reduce call, and some call of every other run: a rank
#     without receives in a call, such as a gather's non-root, has nothing to flush); FAKE_CUDA_CC=90 (Hopper): no
#     call flushes;
#   - ZCCL_GDR=auto applies the path rule: with ZCCL_TOPO_FILE=gpus-nics-only.xml and the fake GPU at PCI 0000:01:00.0
#     (PIX from an RDMA NIC) every call takes GDR; at 0000:11:00.0 (PHB, farther than the default PXB) every rank
#     stages and names the rule's verdict;
#   - ZCCL_GDR_FAKE_PEERMEM=2 on one rank (its registrations of device memory refused): every rank takes
#     staged-pipelined for every call, the refusing rank names its cause, the others name that rank; results exact.
#   - two rails (ZCCL_VM_RAILS=2: every rank on =rxe0,rxe1): GDR at compute capability 9.0 (no flush); at 8.0
#     every call staged, naming the flush that several rails would need (a flush per rail is not built);
#   - a device buffer freed while registered (STALE, tests/rdma/gdr_stale.c; FAKE_CUDA_REUSE_FREED=1 hands the freed
#     address back with other pages): 3 ranks; after rank 0 reallocates its buffer at the same address every call is
#     still "path gdr" and exact, and rank 0 names the re-registration ("was freed and reallocated since it was
#     registered"); a call on the freed buffer fails on every rank, rank 0 naming "freed while registered?".
# Every run has zcclrun's deadline (--timeout). Prints "gdr: PASSED" or "gdr: FAILED".
usage="usage: vm_gdr.sh path/to/zccl-bench path/to/zcclrun path/to/libzccl_fake_cuda.so path/to/gpus-nics-only.xml \
path/to/zccl_gdr_stale"
BENCH=${1:?$usage} RUN=${2:?$usage} FAKE=${3:?$usage} TOPO=${4:?$usage} STALE=${5:?$usage}
here=$(cd "$(dirname "$0")" && pwd)
fail=0
export ZCCL_TIMEOUT_MS=60000 ZCCL_TRANSPORT=ib ZCCL_CUDA_LIBRARY=$FAKE FAKE_CUDA_COPY_MBPS=500
export ZCCL_STAGE_CHUNK_BYTES=64K ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=IB,COLL

# CC=<FAKE_CUDA_CC> GDR=<ZCCL_GDR> PM0=<rank 0's ZCCL_GDR_FAKE_PEERMEM> PM=<the others'> BUSID=<FAKE_CUDA_PCI_BUSID,
# with ZCCL_TOPO_FILE=$TOPO; empty: neither> run NAME N EXPECT OP DT [bench args...]
#   EXPECT: gdr-flush | gdr-noflush | refused | auto-far
run() {
  name=$1 n=$2 expect=$3 op=$4 dt=$5
  shift 5
  FAKE_CUDA_CC=$CC ZCCL_GDR=$GDR PM0=$PM0 PM=$PM BUSID=$BUSID TOPO=$TOPO "$RUN" -n "$n" --timeout 150 \
    sh -c 'if [ "$RANK" = 0 ]; then ZCCL_GDR_FAKE_PEERMEM=$PM0; else ZCCL_GDR_FAKE_PEERMEM=$PM; fi
           export ZCCL_GDR_FAKE_PEERMEM
           [ -n "$BUSID" ] && export FAKE_CUDA_PCI_BUSID=$BUSID ZCCL_TOPO_FILE=$TOPO
           exec sh "$0" "$@"' "$here/rank_hca.sh" \
    "$BENCH" "$op" -D 1 -z 1 -d "$dt" -b 16 -e 1M -f 16 -c 1 -n 1 -w 1 "$@" > /tmp/gdr.out 2> /tmp/gdr.info
  rc=$?
  why=""
  calls=$(grep -c "on device memory: path" /tmp/gdr.info)
  [ "$calls" -gt 0 ] || why="$why; no device call named its path"
  case $expect in
    gdr-*)
      grep "on device memory: path" /tmp/gdr.info | grep -v "path gdr, 0 host staging copies (0 in all)" > /tmp/gdr.bad
      [ -s /tmp/gdr.bad ] && why="$why; calls not on the GDR path or with staging copies: $(head -2 /tmp/gdr.bad)"
      if [ $expect = gdr-flush ]; then
        grep -q "path gdr, .* [1-9][0-9]* GDR flushes" /tmp/gdr.info || why="$why; no call flushed at compute capability $CC"
        # all-reduce: every rank receives in every call, so every call flushes
        [ "$op" = allreduce ] && grep "path gdr" /tmp/gdr.info | grep -q " 0 GDR flushes" &&
          why="$why; an all-reduce call did not flush at compute capability $CC"
      else
        grep "path gdr" /tmp/gdr.info | grep -vq " 0 GDR flushes" && why="$why; a call flushed at compute capability $CC"
      fi ;;
    rails-flush)
      grep "on device memory: path" /tmp/gdr.info | grep -v "path staged-pipelined" > /tmp/gdr.bad
      [ -s /tmp/gdr.bad ] && why="$why; calls not staged: $(head -2 /tmp/gdr.bad)"
      grep -q "no GPUDirect RDMA for this call: the flush is needed and this rank stripes over 2 rails" /tmp/gdr.info ||
        why="$why; no rank named the flush over several rails" ;;
    refused|auto-far)
      grep "on device memory: path" /tmp/gdr.info | grep -v "path staged-pipelined" > /tmp/gdr.bad
      [ -s /tmp/gdr.bad ] && why="$why; calls not staged: $(head -2 /tmp/gdr.bad)"
      if [ $expect = refused ]; then
        grep -q "no GPUDirect RDMA for this call: registering device memory .* failed" /tmp/gdr.info ||
          why="$why; the refusing rank did not name its cause"
        grep -q "no GPUDirect RDMA for this call: rank 0 cannot take the GDR path" /tmp/gdr.info ||
          why="$why; the other ranks did not name the refusing rank"
      else
        [ "$(grep -c "no GPUDirect RDMA for this call: ZCCL_GDR=auto: CUDA device 0 (PCI $BUSID): GPU-NIC path PHB" \
              /tmp/gdr.info)" = "$calls" ] || why="$why; not every call named the path rule's verdict"
      fi ;;
  esac
  if [ "${ZCCL_VM_RAILS:-1}" = 2 ]; then # both NICs carried data (the rail bytes each rank logs at the end)
    grep -q "IB rails: 2 (rxe0:1,rxe1:1)" /tmp/gdr.info || why="$why; not on two rails"
    grep "IB rail bytes:" /tmp/gdr.info | grep -q "rxe0 port 1 [1-9][0-9]* B out .*rxe1 port 1 [1-9][0-9]* B out" ||
      why="$why; a rail carried nothing: $(grep "IB rail bytes:" /tmp/gdr.info | head -1)"
  fi
  [ -n "$why" ] && rc=1
  last=$(grep -E '^ +[0-9]+ +[0-9]+ ' /tmp/gdr.out | tail -1 | awk '{ print $1 " B: #wrong " $9 " / " $13 }')
  if [ $rc -ne 0 ]; then echo "  ${why#; }"; tail -15 /tmp/gdr.out; grep -v "GPUDirect RDMA probe" /tmp/gdr.info | tail -8; fail=1; fi
  echo "gdr: $name $op $dt -n $n: $([ $rc -eq 0 ] && echo ok || echo FAILED) ($calls device calls; largest $last)"
}

# ZCCL_GDR=1, Ampere (flush), 2 ranks: every collective
CC=80 GDR=1 PM0=1 PM=1 BUSID=
for op in allreduce reduce_scatter allgather broadcast reduce alltoall gather scatter; do
  run gdr1-cc80 2 gdr-flush $op float
done
run gdr1-cc80 2 gdr-flush allreduce int32 -o max
run gdr1-cc80 2 gdr-flush reduce_scatter double -o min
# 4 ranks, Ampere
run gdr1-cc80 4 gdr-flush allreduce float
# ZCCL_GDR=auto, Hopper (no flush), 3 ranks, the fake GPU next to an RDMA NIC in the topology file
CC=90 GDR=auto BUSID=0000:01:00.0
run auto-cc90 3 gdr-noflush allreduce double -o prod
run auto-cc90 3 gdr-noflush allreduce float -o avg
run auto-cc90 3 gdr-noflush reduce_scatter int32
run auto-cc90 3 gdr-noflush allgather bfloat16
run auto-cc90 3 gdr-noflush broadcast int32 -r 2
# ZCCL_GDR=auto with the GPU behind another switch than the NIC (PHB): staged, the rule named
BUSID=0000:11:00.0
run auto-phb 2 auto-far allreduce float
# two rails (every rank on =rxe0,rxe1), Hopper: GDR over both rails' NICs (the device buffers registered with each);
# Ampere: the flush would be needed and is not built for several rails, so every call is staged, naming that
CC=90 GDR=1 PM0=1 PM=1 BUSID=
export ZCCL_VM_RAILS=2
run rails2-cc90 2 gdr-noflush allreduce float
run rails2-cc90 3 gdr-noflush allgather float
CC=80
run rails2-cc80 2 rails-flush allreduce float
unset ZCCL_VM_RAILS
# rank 0's registrations of device memory refused: every rank staged, exact
CC=80 GDR=1 PM0=2 PM=1 BUSID=
run refused 3 refused allreduce float
run refused 2 refused allgather int32
# a device buffer freed while registered: reallocated at the same address (registered again), then used after free
FAKE_CUDA_CC=90 ZCCL_GDR=1 ZCCL_GDR_FAKE_PEERMEM=1 FAKE_CUDA_REUSE_FREED=1 "$RUN" -n 3 --timeout 120 \
  sh "$here/rank_hca.sh" "$STALE" > /tmp/gdr.out 2> /tmp/gdr.info
rc=$? why=""
[ "$(grep -c "^gdr_stale: rank [0-9] ok" /tmp/gdr.out)" = 3 ] || why="$why; not every rank ok"
grep -q "device buffer 0x[0-9a-f]* was freed and reallocated since it was registered with rxe.*registered again" \
  /tmp/gdr.info || why="$why; rank 0 did not name the re-registration"
grep "on device memory: path" /tmp/gdr.info | grep -v "path gdr, 0 host staging copies" > /tmp/gdr.bad
[ -s /tmp/gdr.bad ] && why="$why; calls not on the GDR path: $(head -2 /tmp/gdr.bad)"
[ "$(grep -c "on device memory: path gdr" /tmp/gdr.info)" -ge 9 ] || why="$why; fewer than 3 GDR calls per rank"
grep -q "^gdr_stale: rank 0 ok (.*is not device memory that is allocated (freed while registered?)" /tmp/gdr.out ||
  why="$why; rank 0 did not name the freed buffer"
[ -n "$why" ] && rc=1
if [ $rc -ne 0 ]; then echo "  ${why#; }"; tail -8 /tmp/gdr.out; grep -v "GPUDirect RDMA probe" /tmp/gdr.info | tail -8; fail=1; fi
echo "gdr: stale 3 ranks: $([ $rc -eq 0 ] && echo ok || echo FAILED)"
[ $fail -eq 0 ] && echo "gdr: PASSED" || echo "gdr: FAILED"
exit $fail
