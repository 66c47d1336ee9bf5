#!/bin/sh
# rank_hca.sh PROGRAM [ARGS...] — run under zcclrun inside the soft-RoCE VM: even ranks use rxe0 (10.77.0.1), odd
# ranks rxe1 (10.77.0.2), so every ring neighbour pair talks across the veth pair rather than through one device's
# loopback. Rank from RANK (set by zcclrun).
# ZCCL_VM_RAILS=2: every rank on both devices (=rxe0,rxe1: two rails) instead.
case $(( ${RANK:?rank_hca.sh: RANK not set (run it under zcclrun)} % 2 )) in
  0) ZCCL_IB_HCA==rxe0 ;;
  *) ZCCL_IB_HCA==rxe1 ;;
esac
[ "${ZCCL_VM_RAILS:-1}" = 2 ] && ZCCL_IB_HCA==rxe0,rxe1
export ZCCL_IB_HCA
exec "$@"
