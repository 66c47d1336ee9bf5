#!/usr/bin/env bash
# hostfile_parse.sh ZCCLRUN — zcclrun --hostfile without namespaces (no root needed): how ranks are spread over
# "localhost" hosts (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE) and that every malformed hostfile is refused with exit
# status 2 and a message naming the file, the line and the cause. Prints "hostfile_parse: PASSED" at the end.
set -u
RUN=${1:?usage: hostfile_parse.sh ZCCLRUN}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail=0
expect_err() { # name content pattern [extra zcclrun args]
    local name=$1 content=$2 pat=$3; shift 3
    printf '%b' "$content" >"$d/$name"
    out=$("$RUN" --hostfile "$d/$name" "$@" true 2>&1); rc=$?
    if [ $rc -ne 2 ] || ! grep -q -- "$pat" <<<"$out"; then
        echo "FAIL: hostfile '$name': expected exit 2 and '$pat', got $rc: $out"; fail=1
    else
        echo "refused as expected: $out" | head -n 1
    fi
}
expect_err unknown 'node7 slots=2\n' "$d/unknown:1: unknown host 'node7'"
expect_err badslots '# hosts\nlocalhost slots=0\n' "$d/badslots:2: 'slots=0': expected slots=M"
expect_err twice 'localhost\nlocalhost slots=2\n' "$d/twice:2: host 'localhost' is listed twice"
expect_err empty '# nothing\n\n' "no hosts in it"
expect_err nons 'netns:zccl-no-such-ns-$$ slots=1\n' "network namespace 'zccl-no-such-ns-\$\$'"
expect_err slash 'netns:a/b\n' "a namespace name must be 1 to 64 characters"
expect_err toomany 'localhost slots=2\n' "3 ranks asked for, but the hosts of $d/toomany have 2 slots" -n 3
# One localhost host with 3 slots: every slot is a rank, LOCAL_* count within the host; -n 2 uses 2 of them.
printf 'localhost slots=3  # comment\n' >"$d/ok"
got=$("$RUN" --hostfile "$d/ok" sh -c 'echo "$RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE"' 2>&1 | sort)
want=$'0 0 3 3\n1 1 3 3\n2 2 3 3'
[ "$got" = "$want" ] && echo "3 slots -> ranks: $(tr '\n' ';' <<<"$got")" || { echo "FAIL: 3 slots gave: $got"; fail=1; }
got=$("$RUN" --hostfile "$d/ok" -n 2 sh -c 'echo "$RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE"' 2>&1 | sort)
want=$'0 0 2 2\n1 1 2 2'
[ "$got" = "$want" ] && echo "-n 2 of 3 slots -> ranks: $(tr '\n' ';' <<<"$got")" || { echo "FAIL: -n 2 gave: $got"; fail=1; }
[ $fail -eq 0 ] && echo "hostfile_parse: PASSED" || echo "hostfile_parse: FAILED"
exit $fail
