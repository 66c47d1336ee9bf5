#!/bin/sh
# zcclrun_shm_leftovers.sh ZCCLRUN — zcclrun removes the shared-memory inbox names its ranks leave behind when they are
# stopped during communicator creation (/dev/shm/zccl-<id>-r<rank>-p<pid>, transport/shm.c), and nothing else.
# Each rank creates a name of that form with its own pid and fails; a name of another pid must survive.
set -u
run=${1:?usage: zcclrun_shm_leftovers.sh ZCCLRUN}
tag=ctest$$
keep=/dev/shm/zccl-$tag-keep-r0-p1
touch "$keep" || { echo "SKIP: /dev/shm is not writable"; exit 77; }
"$run" -n 3 --timeout 30 sh -c "touch /dev/shm/zccl-$tag-r\$RANK-p\$\$; exit 3" >/dev/null 2>&1
left=$(ls /dev/shm | grep -c "zccl-$tag-r")
kept=$(ls "$keep" 2>/dev/null | wc -l)
rm -f "$keep" /dev/shm/zccl-$tag-r*
if [ "$left" -ne 0 ]; then echo "FAIL: $left inbox names of exited ranks left in /dev/shm"; exit 1; fi
if [ "$kept" -ne 1 ]; then echo "FAIL: zcclrun removed a name that belongs to another process"; exit 1; fi
echo "shm_leftovers: PASSED"
