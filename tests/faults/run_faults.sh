#!/usr/bin/env bash
# run_faults.sh — the zccl fault suite: runs many fault_trial trials (8 ranks, one SIGKILLed — or, on tcp, cut off
# from the network — at a random moment) and prints one table row per transport.
#
#   tests/faults/run_faults.sh [--trials N] [--transport shm|tcp|both] [--seed S] [--bin PATH/fault_trial]
#                              [--deadline SEC] [--faults kill|cut|kill,cut] [--logdir DIR] [--verbose]
#
#   --trials N      trials per transport (default 100)
#   --transport     shm, tcp or both (default both)
#   --seed S        base seed (default 1); trial t of transport X always does the same thing for the same seed
#   --bin PATH      the fault_trial executable (default: $ZCCL_FAULT_TRIAL, next to this script, or build/tests/faults)
#   --deadline SEC  how long after the fault survivors may still run before they count as hangs (default 10)
#   --faults        kinds of fault (default kill,cut; cut applies to tcp only)
#   --logdir DIR    keep every trial's output there (default: a temporary folder, removed unless a trial failed)
#   --verbose       one line per trial
#
# Columns: trials; faults injected (kill/cut); survivors (ranks that should notice: all but a killed victim, and
# the victim too when its links are cut); survivors that erred in time (a failing call returned within 2 s of the
# fault); slowest and median detection (fault -> return of the failing call); the same for faults that landed
# after init (during init a victim that never reached the bootstrap root can only be noticed by
# ZCCL_INIT_TIMEOUT_MS, which fault_trial sets to 1500 ms); hangs (survivors still running at the deadline: must be
# 0); crashes (survivors killed by a signal: must be 0); other (erred late or before the fault, returned wrong
# data, never erred, bad exit, or a trial that could not run: must be 0).
# Exit status: 0 when every survivor of every trial erred in time, 1 otherwise, 2 on a usage error.
set -u

trials=100 transport=both seed=1 bin="${ZCCL_FAULT_TRIAL:-}" deadline=10 faults=kill,cut logdir="" verbose=0
usage() { sed -n '2,/^set -u/p' "$0" | sed -n 's/^# \{0,1\}//p' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --trials) trials="${2:?}"; shift 2 ;;
    --transport) transport="${2:?}"; shift 2 ;;
    --seed) seed="${2:?}"; shift 2 ;;
    --bin) bin="${2:?}"; shift 2 ;;
    --deadline) deadline="${2:?}"; shift 2 ;;
    --faults) faults="${2:?}"; shift 2 ;;
    --logdir) logdir="${2:?}"; shift 2 ;;
    --verbose) verbose=1; shift ;;
    -h|--help) usage ;;
    *) echo "run_faults.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
case "$transport" in
  shm|tcp) transports="$transport" ;;
  both) transports="shm tcp" ;;
  *) echo "run_faults.sh: --transport must be shm, tcp or both" >&2; exit 2 ;;
esac
case "$trials" in ''|*[!0-9]*) echo "run_faults.sh: --trials must be a number" >&2; exit 2 ;; esac

here="$(cd "$(dirname "$0")" && pwd)"
if [ -z "$bin" ]; then
  for c in "$here/fault_trial" "$here/../../build/tests/faults/fault_trial"; do
    [ -x "$c" ] && { bin="$c"; break; }
  done
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "run_faults.sh: fault_trial not found; build it (tests/faults/CMakeLists.txt) and pass --bin PATH" >&2
  exit 2
fi

keep=0
if [ -z "$logdir" ]; then
  logdir="$(mktemp -d "${TMPDIR:-/tmp}/zccl-faults.XXXXXX")"
else
  mkdir -p "$logdir"; keep=1
fi

failed=0
rows=()
for tr in $transports; do
  : >"$logdir/$tr.trials"
  for ((t = 0; t < trials; t++)); do
    out="$logdir/$tr.$t.out" err="$logdir/$tr.$t.err"
    # The trial bounds itself (deadline after the fault); the outer timeout only catches a stuck parent.
    timeout -s KILL $((deadline + 60)) "$bin" --transport "$tr" --seed "$seed" --trial "$t" --deadline "$deadline" \
      --faults "$faults" >"$out" 2>"$err"
    rc=$?
    line="$(grep '^TRIAL ' "$out" | tail -n 1)"
    if [ -z "$line" ]; then
      line="TRIAL transport=$tr seed=$seed trial=$t pass=0 setup_failed=1 rc=$rc"
    fi
    echo "$line" >>"$logdir/$tr.trials"
    if [ "$rc" -ne 0 ] || ! grep -q ' pass=1 ' <<<"$line"; then
      failed=1
      {
        echo "---- FAILED: $tr trial $t (seed $seed, exit $rc); rerun: $bin --transport $tr --seed $seed --trial $t --verbose"
        grep -v '^TRIAL ' "$out"
        echo "$line"
        if [ -s "$err" ]; then echo "  ranks' stderr (last 30 lines):"; tail -n 30 "$err" | sed 's/^/  | /'; fi
      } >&2
    elif [ "$verbose" = 1 ]; then
      echo "$line" | cut -c1-240 >&2
    else
      printf '.' >&2
    fi
  done
  [ "$verbose" = 1 ] || printf '\n' >&2

  # One row: sums of the per-trial counters, detection statistics over every survivor that erred.
  rows+=("$(awk -v tr="$tr" '
    function get(k,   i, a) { for (i = 1; i <= NF; i++) { split($i, a, "="); if (a[1] == k) return a[2] } return "" }
    function median(v, n,   i, j, x) {
      for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
      return n == 0 ? "-" : (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2)
    }
    {
      n++
      if (get("setup_failed") == 1) { other++; next }
      inj += get("injected"); if (get("fault") == "cut") cut++; else kill++
      surv += get("survivors"); intime += get("intime"); hangs += get("hangs"); crashes += get("crashes")
      other += get("late") + get("early") + get("noerr") + get("wrong") + get("badexit")
      if (get("injected") != 1) other++
      at = get("victim_at"); post = !(at ~ /^(forked|init):/)
      if (!post) initf++
      d = get("det_ms")
      if (d != "-") {
        m = split(d, v, ",")
        for (i = 1; i <= m; i++) {
          x = v[i] + 0; all[++na] = x; if (x > maxa) maxa = x
          if (post) { aft[++nb] = x; if (x > maxb) maxb = x }
        }
      }
    }
    END {
      printf "%-4s %7d %8s %10d %9d %10.1f %9.1f %10.1f %10.1f %6d %8d %6d\n", tr, n,
             sprintf("%d/%d", kill + 0, cut + 0), surv, intime, maxa, median(all, na), maxb, median(aft, nb),
             hangs, crashes, other
    }' "$logdir/$tr.trials")")
done

echo
echo "zccl fault suite: $trials trials per transport, 8 ranks, seed $seed, deadline ${deadline} s, in time = 2 s"
printf '%-4s %7s %8s %10s %9s %10s %9s %10s %10s %6s %8s %6s\n' "" "" "faults" "" "erred" "slowest" "median" \
  "slowest" "median" "" "" ""
printf '%-4s %7s %8s %10s %9s %10s %9s %10s %10s %6s %8s %6s\n' "tr." "trials" "kill/cut" "survivors" "in time" \
  "det. ms" "det. ms" "post-init" "post-init" "hangs" "crashes" "other"
for r in "${rows[@]}"; do echo "$r"; done
for tr in $transports; do
  awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^victim_at=/) { split($i, a, "[=:]"); c[a[2]]++ } }
       END { printf "  %s: fault landed with the victim in", T; for (k in c) printf " %s:%d", k, c[k]; printf "\n" }' \
      T="$tr" "$logdir/$tr.trials"
done

if [ "$failed" = 1 ]; then
  echo "FAILED: some survivor did not err in time (details above); trial outputs kept in $logdir"
  exit 1
fi
[ "$keep" = 1 ] || rm -rf "$logdir"
echo "PASSED"
exit 0
