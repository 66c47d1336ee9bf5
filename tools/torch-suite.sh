#!/usr/bin/env bash
# Runs torch's own distributed test suite (distributed_test.py's _DistTestBase, torch 2.6) against gloo and zccl
# at world size 2 (or --world-size N) in the torch 2.6 root of tools/torch2-root.sh, one backend after the other, and compares them.
#
# Usage: tools/torch-suite.sh [--backends "gloo zccl"] [-k EXPR | --subset] [--world-size N] [--timeout S] [--out DIR]
#   --backends  the backends, in order (default "gloo zccl"); the comparison takes the first as the reference
#   -k EXPR     pytest's -k: the tests to run (default: all of _DistTestBase)
#   --subset    the documented subset (bindings/torch/suite/subset.txt; docs/torch.md, "torch's own distributed
#               suite"): 93 tests, about 20 minutes per backend on 2 shared cores
#   --world-size  ranks per test (default 2; torch's WORLD_SIZE; its tests are written for 2 or more)
#   --timeout   seconds a test may take before torch's harness kills its ranks (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT;
#               default 120 here, torch's own default is 300)
#   --out       where the logs, junit XML and summary go (default /build/torch-suite in the root, which is
#               $ZCCL_TORCH2_ROOT/build/torch-suite on the host)
# From the host (as root) it goes through tools/torch2-root.sh (which builds zccl and zccl_torch first); inside
# the root (`tools/torch2-root.sh --shell`) it runs directly. Writes OUT/<backend>.log, OUT/<backend>.xml,
# OUT/summary.txt and OUT/summary.md (bindings/torch/suite/compare.py).
set -euo pipefail

# The deterministic subset: the test names in bindings/torch/suite/subset.txt (how they were chosen: its header).
SUBSET_FILE=bindings/torch/suite/subset.txt

backends="gloo zccl"
kexpr=""
subset=0
timeout=120
world=2
out=""
inroot=0
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --backends) backends="$2"; shift 2 ;;
    -k) kexpr="$2"; shift 2 ;;
    --subset) subset=1; shift ;;
    --timeout) timeout="$2"; shift 2 ;;
    --world-size) world="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --in-root) inroot=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--backends LIST] [-k EXPR | --subset] [--world-size N] [--timeout S] [--out DIR]" >&2; exit 2 ;;
  esac
done
case "$world" in
  ''|*[!0-9]*) echo "tools/torch-suite.sh: --world-size must be a whole number of ranks, 2 or more (got '$world')" >&2; exit 2 ;;
esac
if [ "$world" -lt 2 ]; then
  echo "tools/torch-suite.sh: --world-size must be 2 or more (got $world): torch's distributed tests need a peer" >&2
  exit 2
fi

if [ $inroot = 0 ] && ! python3 -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  cd "$(dirname "$0")/.."
  exec tools/torch2-root.sh -- tools/torch-suite.sh --in-root "${args[@]}"
fi

cd "$(dirname "$0")/.."
out="${out:-/build/torch-suite}"
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:-/build/bindings/torch/python}"
echo "tools/torch-suite.sh: torch $(python3 -c 'import torch; print(torch.__version__)'), world size $world," \
     "per-test timeout ${timeout} s, selection: $([ $subset = 1 ] && echo "$SUBSET_FILE" || echo "${kexpr:-all of _DistTestBase}"), out $out"
suite=bindings/torch/suite/torch_dist_suite.py
targets=("$suite")
if [ $subset = 1 ]; then
  targets=()
  while read -r t; do targets+=("$suite::TestDistBackendWithSpawn::$t"); done < <(grep -v '^#' "$SUBSET_FILE" | grep .)
fi
rm -f "$out/walltime.txt"
for b in $backends; do
  t0=$(date +%s)
  rc=0
  env -u TEMP_DIR -u INIT_METHOD BACKEND="$b" WORLD_SIZE="$world" DISTRIBUTED_TESTS_DEFAULT_TIMEOUT="$timeout" \
    python3 -m pytest -p no:cacheprovider -q -rs ${kexpr:+-k "$kexpr"} --junitxml="$out/$b.xml" \
    -o junit_logging=no "${targets[@]}" >"$out/$b.log" 2>&1 || rc=$?
  t1=$(date +%s)
  echo "tools/torch-suite.sh: $b: $(tail -n 1 "$out/$b.log") (pytest rc $rc, wall $((t1 - t0)) s)"
  echo "$b wall_s=$((t1 - t0)) rc=$rc" >>"$out/walltime.txt"
done
set -- $backends
if [ $# -ge 2 ]; then
  python3 bindings/torch/suite/compare.py "$out/$1.xml" "$out/$2.xml" | tee "$out/summary.txt"
  python3 bindings/torch/suite/compare.py "$out/$1.xml" "$out/$2.xml" --md >"$out/summary.md"
fi
