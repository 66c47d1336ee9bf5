#!/usr/bin/env bash
# Builds the test suite with a sanitizer and runs a reduced suite under it; exits non-zero on any failure or report.
#
# Usage: tools/sanitize.sh address|thread [gtest-filter]
#   address  ASan + UBSan (-DZCCL_SANITIZE=address), build dir build-asan
#   thread   TSan         (-DZCCL_SANITIZE=thread),  build dir build-tsan
#   gtest-filter  replaces the reduced suite (e.g. 'Faults.*'); "all" runs every test.
# Environment: ZCCL_SANITIZE_BUILD_DIR overrides the build dir; ZCCL_SANITIZE_JOBS the build parallelism (2);
#              ZCCL_SANITIZE_TIMEOUT the run's wall-clock limit in seconds (900); ZCCL_SANITIZE_BUILD_ONLY=1
#              configures and builds, then stops (.ci/run builds both trees in the background during the main
#              suite; the later run then finds them built).
#
# Every rank of a multi-process test is a child forked from the test process. Sanitizer reports go to files
# (log_path) instead of stderr, so that a report is seen even in a child whose failure a test expects (a killed
# rank, an impostor) or whose output is not shown: after the run the script prints every report file and fails if
# there is one. The reports name the process (pid) that produced them; a failing test's message names its ranks'
# pids.
#
# ThreadSanitizer (gcc 12's libtsan) aborts at start-up ("unexpected memory mapping") when the kernel places
# mappings where its shadow-memory layout does not expect them (high vm.mmap_rnd_bits, newer kernels). The script
# runs the TSan binary under `setarch <arch> -R`, which disables address-space randomisation for that process (and
# the ranks it forks) only; nothing on the machine changes. For the same reason the build dir is configured with
# gtest discovery at test time (CMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST), so that building does not run
# the binary; the suite is run directly with the GoogleTest binary rather than through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
address) tag=asan ;;
thread) tag=tsan ;;
*)
    echo "usage: $0 address|thread [gtest-filter]" >&2
    exit 2
    ;;
esac

# hwloc's PCI discovery (its pci component, libpciaccess) reallocates large buffers step by step; under the
# sanitizers' allocators every step is a fresh allocation, a copy and a free, with a page fault per new page: a
# rank's topology load took 6 s under TSan instead of 50 ms, and the TSan run 240 s instead of 29 s (2026-12-07,
# every rank of every test loads the topology at communicator creation). The component is hwloc's code, not zccl's,
# and this machine kind has no GPU or RDMA NIC for it to find, so the sanitized runs leave it out unless
# HWLOC_COMPONENTS is already set. zccl's own handling of PCI objects (GPUs, NICs, pairing) is tested from XML
# topologies, which do not use the component.
export HWLOC_COMPONENTS="${HWLOC_COMPONENTS:--pci}"

# ---- the reduced suites -----------------------------------------------------------------------------------------
# address: schedules, a subset of the kernels, every collective on 3 ranks over shm and 2 ranks over TCP (and a
# small chunk size), streams, argument checking, init from the environment, security (impostors, hostile
# connections), faults (killed ranks, timeouts, ZCCL_CHECK, abort from another thread).
asan='Schedule.*'
asan+=':Kernels.Reduce*:Kernels.ScaleAllTypes:Kernels.ZeroCountTouchesNothing:Kernels.*SpecialCases'
asan+=':Kernels.StreamCopyMatchesMemcpy:Kernels.AverageInt32ManyDivisors:Kernels.CopyMatchesMemcpyAtEveryDistance'
asan+=':Transports/CollectivesMatrix.*/shm_3ranks:Transports/CollectivesMatrix.*/tcp_2ranks'
asan+=':SmallChunks/CollectivesMatrix.*/shm_tiny_2ranks'
asan+=':Transports/StreamsAndSequencing.*/shm_2ranks:Transports/StreamsAndSequencing.*/tcp_2ranks'
asan+=':ApiArgs.*:InitEnv.TorchrunVariables:InitEnv.MissingOrMalformedVariablesAreNamed'
asan+=':Security.*:ClaimedRank/ImpostorWithWrongSecret.*:Faults.*:CheckAbort.*:*/AbortParam.*:Flood.*'
asan+=':Zero*:ScheduleV.*:*SplitV.*'   # bucket scheduler and ZeRO-3 store; uneven collectives and comm split
asan+=':RegMem.*'   # registered buffers: deregistering closes the peers' mappings, then the memory is freed
asan+=':*SumOrder.*:BootstrapPort.*'   # the staged path's bounce buffer; a self-connected socket dropped
# Left out: ZeroOffload.FakeDevice*, which needs its own process (as ctest gives it): the memory layer decides
# once per process whether a CUDA driver is there, and an earlier test of this shared process already decided "no"
# without the fake driver, so the forked ranks inherit "every buffer is host memory".
asan+='-ZeroOffload.FakeDevice*'
# thread: gcc 12's TSan cannot follow a rank forked from the multi-threaded test process (the bootstrap root of
# zccl_get_unique_id is a thread of it): after such a fork it ignores every access and suppresses every report in
# the child, and it dies with "dup thread with used id" when the child starts a thread on the reused stack of one of
# the parent's. So TSan runs (1) the tests whose threads run in the test process itself (a 1-rank communicator,
# the per-thread last error, schedules, kernels); (2) InitEnv.*, whose ranks are forked from a
# single-threaded test process (rank 0 hosts the root); (3) zcclrun + zccl-bench, whose ranks are exec'd (a fresh
# TSan runtime each), all five collectives on 3 ranks over shm and over TCP with a zccl stream, checking results.
tsan='Schedule.*:Kernels.Reduce*:Kernels.ScaleAllTypes:Kernels.StreamCopyMatchesMemcpy'
tsan+=':Kernels.CopyMatchesMemcpyAtEveryDistance'
tsan+=':ApiArgs.OneRankCommunicatorInProcess:ApiArgs.NoCommunicatorEntries:ApiArgs.ErrorStrings'
tsan+=':ApiArgs.LastErrorIsPerThreadAndKeptAcrossSuccess'
custom=0
if [[ -n "${2:-}" ]]; then
    filter="$2"
    custom=1
elif [[ "$mode" == address ]]; then
    filter="$asan"
else
    filter="$tsan"
fi
[[ "$filter" == all ]] && filter='*'

build="${ZCCL_SANITIZE_BUILD_DIR:-build-$tag}"
jobs="${ZCCL_SANITIZE_JOBS:-2}"
limit="${ZCCL_SANITIZE_TIMEOUT:-900}"

t0=$(date +%s)
echo "== sanitize.sh $mode: configuring $build"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZCCL_SANITIZE="$mode" \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log"
    exit 1
}
targets=(zccl_tests)
[[ "$mode" == thread && $custom -eq 0 ]] && targets+=(zcclrun zccl-bench)
echo "== sanitize.sh $mode: building ${targets[*]} (-j$jobs)"
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
t1=$(date +%s)
if [[ "${ZCCL_SANITIZE_BUILD_ONLY:-0}" == 1 ]]; then
    echo "== sanitize.sh $mode: built in $((t1 - t0)) s (ZCCL_SANITIZE_BUILD_ONLY=1: not run)"
    exit 0
fi

bin="$build/tests/zccl_tests"
logdir="$build/sanitizer-reports"
rm -rf "$logdir" "$logdir.limitations"
mkdir -p "$logdir"
runner=()
if [[ "$mode" == address ]]; then
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1:check_initialization_order=1:log_path=$logdir/asan"
    export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$logdir/ubsan"
    export LSAN_OPTIONS="log_path=$logdir/lsan"
else
    # die_after_fork=0: the test process holds threads (the bootstrap root of zccl_get_unique_id) when it forks
    # the ranks, and the ranks start threads of their own; TSan's default kills such a child.
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:log_path=$logdir/tsan"
    arch="$(uname -m)"
    if setarch "$arch" -R true 2>/dev/null; then
        runner=(setarch "$arch" -R)
    else
        echo "== sanitize.sh thread: WARNING: 'setarch $arch -R' is not permitted here (personality(2) blocked);" \
            "running with address-space randomisation, TSan may fail to start" >&2
    fi
fi

# Probe: a sanitizer that cannot start here must say so, not pass silently.
if ! "${runner[@]}" "$bin" --gtest_list_tests >"$build/list.txt" 2>&1; then
    echo "== sanitize.sh $mode: FAILED: the sanitized test binary does not start:" >&2
    cat "$build/list.txt" "$logdir"/* 2>/dev/null | head -50 >&2
    exit 1
fi

run_suite() { # filter log
    local r=0
    "${runner[@]}" timeout -k 10 "$limit" "$bin" --gtest_filter="$1" --gtest_brief=1 2>&1 | tee "$2" || r=$?
    return $r
}

echo "== sanitize.sh $mode: running (filter: $filter)"
rc=0
run_suite "$filter" "$build/run.log" || rc=$?

# gcc 12's libasan does not make its allocator safe across fork() (newer compiler-rt locks it around fork): when
# the test process forks a rank while another of its threads (the bootstrap root) holds an allocator lock, the
# rank deadlocks in malloc, and the harness reports a hang ("deadline exceeded"). Tests that failed only by such a
# hang are run once more; any other failure, a hang that repeats, or any sanitizer report still fails the run.
if [[ $rc -ne 0 && $rc -ne 124 && "$mode" == address ]] && ! compgen -G "$logdir/*" >/dev/null; then
    failed=$(awk '/^\[  FAILED  \] .* \([0-9]+ ms\)$/ { n = $4; sub(/,$/, "", n); print n "\t" (hang ? "hang" : "other");
                                                      hang = 0; next }
                  /deadline exceeded|killed at deadline/ { hang = 1 }' "$build/run.log")
    if [[ -n "$failed" ]] && ! grep -qv $'\thang$' <<<"$failed"; then
        again=$(cut -f1 <<<"$failed" | paste -sd: -)
        echo "== sanitize.sh $mode: $(wc -l <<<"$failed") test(s) failed only by a hang (possibly gcc 12 ASan's" \
            "fork deadlock, see the script); running them once more: $again"
        rc=0
        run_suite "$again" "$build/rerun.log" || rc=$?
    fi
fi

if [[ "$mode" == thread && $custom -eq 0 && $rc -eq 0 ]]; then
    echo "== sanitize.sh thread: InitEnv.* (ranks forked from a single-threaded test process)"
    run_suite 'InitEnv.*' "$build/run-initenv.log" || rc=$?
fi
if [[ "$mode" == thread && $custom -eq 0 && $rc -eq 0 ]]; then
    for tp in shm tcp; do
        for op in allreduce reduce_scatter allgather broadcast reduce; do
            echo "== sanitize.sh thread: zcclrun -n 3 zccl-bench $op (ZCCL_TRANSPORT=$tp, stream, checked)"
            ZCCL_TRANSPORT=$tp "${runner[@]}" timeout -k 10 300 "$build/tools/zcclrun" -n 3 --timeout 240 \
                "$build/tools/zccl-bench" "$op" -b 8 -e 256K -f 32 -c 1 -n 2 -w 1 -d float -o sum \
                >"$build/run-bench-$tp-$op.log" 2>&1 || {
                rc=$?
                cat "$build/run-bench-$tp-$op.log"
                break 2
            }
        done
    done
fi
t2=$(date +%s)

# A rank forked from the multi-threaded test process that starts a thread can make gcc 12's TSan die with only
# "dup thread with used id" (see above): a limitation of the runtime, not a finding; such a process was not being
# checked anyway. Those files are listed and set aside; every other file is a report and fails the run.
if [[ "$mode" == thread ]]; then
    for f in "$logdir"/*; do
        [[ -e "$f" ]] || continue
        if grep -q "dup thread with used id" "$f" && ! grep -q "WARNING: ThreadSanitizer\|SUMMARY:" "$f"; then
            echo "== sanitize.sh thread: note: $(basename "$f"): TSan gave up on a process forked from a" \
                "multi-threaded one (dup thread with used id); not a finding"
            mkdir -p "$logdir.limitations"
            mv "$f" "$logdir.limitations/"
        fi
    done
fi
reports=("$logdir"/*)
if [[ -e "${reports[0]}" ]]; then
    echo "== sanitize.sh $mode: ${#reports[@]} sanitizer report(s):" >&2
    for f in "${reports[@]}"; do
        echo "---- $f" >&2
        cat "$f" >&2
    done
    [[ $rc -ne 0 ]] || rc=1
fi
if [[ $rc -eq 124 ]]; then echo "== sanitize.sh $mode: the run passed its ${limit} s limit" >&2; fi
echo "== sanitize.sh $mode: build $((t1 - t0)) s, run $((t2 - t1)) s: $([[ $rc -eq 0 ]] && echo PASSED || echo "FAILED (exit $rc)")"
exit "$rc"
