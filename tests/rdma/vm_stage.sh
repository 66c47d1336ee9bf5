#!/bin/sh
# vm_stage.sh ZCCL_BENCH ZCCLRUN FAKE_CUDA — runs inside the soft-RoCE VM (tests/rdma/run_vm.sh; ctest
# RDMA.soft_roce_device_staging; issue 24): device-buffer collectives over the verbs transport with the fake CUDA
# driver (device memory = host memory, copies on threads throttled to FAKE_CUDA_COPY_MBPS), so the pipelined staging
# runs over rxe: zccl-bench -D 1 -c 1 (every element checked) for all-reduce, reduce-scatter, all-gather, broadcast
# and reduce, float32 and int32 SUM (the fake's kernels), 16 B .. 1 MiB with 64 KiB chunks, 2 and 3 ranks on
# rxe0/rxe1 (rank_hca.sh). Each run must name the path "staged-pipelined" at INFO, and the GPUDirect probe must say
# that rxe has no dma-buf (rxe answers EOPNOTSUPP to ibv_reg_dmabuf_mr).
# Prints "stage: PASSED" or "stage: FAILED".
usage="usage: vm_stage.sh path/to/zccl-bench path/to/zcclrun path/to/libzccl_fake_cuda.so"
BENCH=${1:?$usage} RUN=${2:?$usage} FAKE=${3:?$usage}
here=$(dirname "$0")
fail=0
export ZCCL_TIMEOUT_MS=60000 ZCCL_TRANSPORT=ib ZCCL_CUDA_LIBRARY=$FAKE FAKE_CUDA_COPY_MBPS=500
export ZCCL_STAGE_CHUNK_BYTES=64K ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=IB,COLL
for n in 2 3; do
  for op in allreduce reduce_scatter allgather broadcast reduce; do
    for dt in float int32; do
      "$RUN" -n $n --timeout 150 sh "$here/rank_hca.sh" "$BENCH" $op -D 1 -z 1 -d $dt -b 16 -e 1M -f 16 -c 1 -n 1 -w 1 \
        > /tmp/stage.out 2> /tmp/stage.info; rc=$?
      last=$(grep -E '^ +[0-9]+ +[0-9]+ ' /tmp/stage.out | tail -1 | awk '{ print $1 " B: #wrong " $9 " / " $13 }')
      grep -q "path staged-pipelined" /tmp/stage.info || { echo "  no staged-pipelined INFO line"; rc=1; }
      if [ $rc -ne 0 ]; then tail -20 /tmp/stage.out /tmp/stage.info; fail=1; fi
      echo "stage: $op $dt -n $n: $([ $rc -eq 0 ] && echo ok || echo FAILED) (largest $last)"
    done
  done
done
grep -h "GPUDirect RDMA probe" /tmp/stage.info | sort -u | head -2
grep -q "GPUDirect RDMA probe: NIC no dma-buf" /tmp/stage.info || { echo "stage: the probe did not report rxe's missing dma-buf"; fail=1; }
[ $fail -eq 0 ] && echo "stage: PASSED" || echo "stage: FAILED"
exit $fail
