#!/usr/bin/env bash
# Installs what building and testing zccl needs on Debian 12 (run as root, or with sudo available).
# Usage: tools/deps.sh [--bench]   (--bench adds Open MPI, MPICH, Gloo and iperf3 for bench/compare)
set -euo pipefail
pkgs=(cmake make gcc g++ pkg-config libssl-dev googletest libgtest-dev iproute2 libhwloc-dev libxml2-dev
      libjansson-dev graphviz clang libclang-rt-14-dev zlib1g-dev)
# The soft-RoCE VM test (tests/rdma/, ctest RDMA.soft_roce_*): QEMU, Debian's kernel with its rdma_rxe modules,
# busybox as the guest's shell, rdma-core's verbs/rdma_cm libraries with the rxe provider, their reference tools
# (ibv_rc_pingpong, rping, ib_write_bw) and cpio for the initramfs. libibverbs-dev/librdmacm-dev build the IB transport.
pkgs+=(libibverbs-dev librdmacm-dev rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest qemu-system-x86
       linux-image-amd64 busybox-static cpio)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(openmpi-bin libopenmpi-dev mpich libmpich-dev libgloo-dev iperf3)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  echo "tools/deps.sh: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
