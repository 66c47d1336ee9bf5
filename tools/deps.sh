#!/usr/bin/env bash
# Installs, on Debian 12 (as root, or with sudo), what zccl needs; only the packages that are missing.
# Usage: tools/deps.sh [--test] [--vm] [--bench] [--list]
#   (none)   building the library, its tools and examples, and running them: compiler, CMake, pkg-config, OpenSSL,
#            hwloc, libxml2, jansson, zlib, rdma-core's verbs/rdma_cm libraries (for the optional IB transport)
#   --test   adds the test suite's packages: GoogleTest, iproute2 (network namespaces), clang + libFuzzer, graphviz,
#            Open MPI and PyTorch (launcher lines of the README, the torch binding), pytest, NumPy, Python headers
#   --vm     adds the soft-RoCE VM test's packages (tests/rdma/): QEMU, Debian's kernel with rdma_rxe, busybox, cpio,
#            rdma-core's providers and reference tools
#   --bench  adds the peers of bench/compare: Open MPI, MPICH, Gloo, iperf3 (and iproute2 for --hosts)
#   --list   prints the packages that would be installed (missing ones) and exits
# apt's own progress is shown. .ci/run calls `tools/deps.sh --test --vm`. With DEPS_DRY_RUN=1 in the environment
# nothing is installed: the missing packages are only named (tests/docs/readme_commands.sh runs the README that way).
set -euo pipefail
usage() { sed -n '2,12s/^# \{0,1\}//p' "$0"; }
# Building and running: the library (OpenSSL for the handshake, hwloc and libxml2 for the topology, libibverbs and
# librdmacm for the optional InfiniBand/RoCE transport), zccl-topo (jansson), the ZeRO example (zlib).
pkgs=(cmake make gcc g++ pkg-config libssl-dev libhwloc-dev libxml2-dev libjansson-dev zlib1g-dev
      libibverbs-dev librdmacm-dev)
list=0
for a in "$@"; do
  case "$a" in
  --test)
    pkgs+=(googletest libgtest-dev iproute2 clang libclang-rt-14-dev graphviz openmpi-bin
           python3-torch libtorch-dev pybind11-dev python3-pytest python3-numpy python3-dev) ;;
  --vm)
    pkgs+=(rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest qemu-system-x86 linux-image-amd64
           busybox-static cpio iproute2) ;;
  --bench) pkgs+=(openmpi-bin libopenmpi-dev mpich libmpich-dev libgloo-dev iperf3 iproute2) ;;
  --list) list=1 ;;
  -h | --help) usage; exit 0 ;;
  *) echo "tools/deps.sh: unknown option '$a'" >&2; usage >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  [[ " ${missing[*]} " == *" $p "* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((list)); then
  ((${#missing[@]})) && printf '%s\n' "${missing[@]}"
  exit 0
fi
if ((${#missing[@]} == 0)); then
  echo "tools/deps.sh: every package is installed (${#pkgs[@]} checked)"
  exit 0
fi
if [[ "${DEPS_DRY_RUN:-0}" == 1 ]]; then
  echo "tools/deps.sh: DEPS_DRY_RUN=1: would install ${missing[*]}"
  exit 0
fi
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
command -v apt-get >/dev/null || { echo "tools/deps.sh: apt-get not found; install by hand: ${missing[*]}" >&2; exit 1; }
echo "tools/deps.sh: installing ${missing[*]}"
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
