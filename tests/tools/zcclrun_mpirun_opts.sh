#!/bin/sh
# zcclrun_mpirun_opts.sh ZCCLRUN — mpirun's habits that zcclrun takes (ctest Tools.zcclrun_mpirun_opts):
#   -x VAR=VALUE sets VAR for every rank; -x VAR (export an existing variable) is accepted and changes nothing;
#   --oversubscribe is accepted; a malformed -x fails with status 2 naming it.
# Prints "zcclrun_mpirun_opts: PASSED" or "... FAILED: why".
RUN=${1:?usage: zcclrun_mpirun_opts.sh path/to/zcclrun}
why=
out=$(ZT_KEEP=kept timeout 60 "$RUN" -n 3 --oversubscribe -x ZT_X=4=2 -x ZT_KEEP --timeout 50 \
      sh -c 'echo "rank $RANK x=$ZT_X keep=$ZT_KEEP"' 2>&1) || why="$why; the run exited $?: $out"
for r in 0 1 2; do
  echo "$out" | grep -qx "rank $r x=4=2 keep=kept" || why="$why; rank $r did not get ZT_X=4=2 and ZT_KEEP: $out"
done
err=$(timeout 30 "$RUN" -n 2 -x 9LIVES=1 true 2>&1); rc=$?
[ $rc = 2 ] || why="$why; -x 9LIVES=1 exited $rc, not 2"
echo "$err" | grep -q "'9LIVES=1' is not VAR or VAR=VALUE" || why="$why; -x 9LIVES=1 said: $err"
err=$(timeout 30 "$RUN" -x 2>&1); rc=$?
[ $rc = 2 ] && echo "$err" | grep -q "option '-x' needs" || why="$why; a lone -x exited $rc: $err"
if [ -z "$why" ]; then echo "zcclrun_mpirun_opts: PASSED"; else echo "zcclrun_mpirun_opts: FAILED$why"; exit 1; fi
