#!/bin/sh
# zcclrun_shm_leftovers.sh ZCCLRUN — zcclrun removes the shared-memory inbox names its ranks leave behind when they are
# stopped during communicator creation (/dev/shm/zccl-<id>-r<rank>-p<pid>, transport/shm.c), and nothing else.
# Each rank creates a name of that form with its own pid (through a child process, `touch`, that may outlive a
# stopped rank) and fails; a name of another pid must survive. Then: a process a stopped rank started in the
# background must not outlive the job (zcclrun is a child subreaper and stops orphans of a stopped job).
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
pidfile=/tmp/zccl-$tag-orphan.pid
rm -f "$pidfile"
"$run" -n 2 --timeout 30 sh -c "if [ \$RANK = 1 ]; then sleep 300 & echo \$! > $pidfile; wait; fi; sleep 0.3; exit 3" \
    >/dev/null 2>&1
orphan=$(cat "$pidfile" 2>/dev/null)
rm -f "$pidfile"
if [ -z "$orphan" ]; then echo "FAIL: rank 1 did not start its background process"; exit 1; fi
if kill -0 "$orphan" 2>/dev/null; then
    kill "$orphan"
    echo "FAIL: process $orphan started by a stopped rank outlived the job"
    exit 1
fi
echo "shm_leftovers: PASSED"
