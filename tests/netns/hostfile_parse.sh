#!/usr/bin/env bash
# hostfile_parse.sh ZCCLRUN — zcclrun --hostfile without namespaces (no root needed): how ranks are spread over
# "localhost" hosts (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE), that every malformed hostfile is refused with exit
# status 2 and a message naming the file, the line and the cause, and how ranks on ssh hosts are started: with a
# stand-in for ssh (--ssh) that records its arguments and runs the remote command here, the ranks must get their
# variables, the ZCCL_*/NCCL_* ones and the same directory through ssh's stdin, and the job secret must not be on
# the remote shell's command line. Prints "hostfile_parse: PASSED" at the end.
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
expect_err unknown 'no/de7 slots=2\n' "$d/unknown:1: unknown host 'no/de7'"
expect_err option 'ssh:-oProxyCommand=x slots=2\n' "$d/option:1: unknown host 'ssh:-oProxyCommand=x'"
expect_err twice_ssh 'node7\nssh:node7 slots=2\n' "$d/twice_ssh:2: host 'ssh:node7' is listed twice"
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
# ssh hosts through a stand-in remote shell: "fake_ssh HOST COMMAND" logs its arguments and runs COMMAND here
# in a fresh environment, as a remote login would (only what comes through stdin is set).
printf '#!/bin/sh\nprintf "%%s\\n" "$*" >>"%s/ssh_args.$$"\nexec env -i PATH="$PATH" HOME="$HOME" sh -c "$2"\n' "$d" \
    >"$d/fake_ssh"
chmod +x "$d/fake_ssh"
printf 'ssh:alpha slots=2\nuser@beta\n' >"$d/sshhosts"
mkdir -p "$d/work dir"
got=$(cd "$d/work dir" && ZCCL_SECRET=0123456789abcdef0123456789abcdef ZCCL_FOO='a b' NCCL_BAR=1 NOT_PASSED=1 \
      "$RUN" --hostfile "$d/sshhosts" --ssh "$d/fake_ssh" --port 4321 \
      sh -c 'read -r line; echo "$RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE $MASTER_ADDR $MASTER_PORT ${#ZCCL_SECRET} [$ZCCL_FOO] $NCCL_BAR ${NOT_PASSED:-unset} $(basename "$PWD") stdin:${line:-empty}"' 2>&1 | sort)
want=$(printf '%s\n' "0 0 2 3 alpha 4321 32 [a b] 1 unset work dir stdin:empty" \
                     "1 1 2 3 alpha 4321 32 [a b] 1 unset work dir stdin:empty" \
                     "2 0 1 3 alpha 4321 32 [a b] 1 unset work dir stdin:empty")
[ "$got" = "$want" ] && echo "ssh hosts -> ranks: $(tr '\n' ';' <<<"$got")" || { echo "FAIL: ssh hosts gave: $got"; echo "  want: $want"; fail=1; }
args=$(cat "$d"/ssh_args.* 2>/dev/null)
if [ "$(wc -l <<<"$args")" -ne 3 ] || ! grep -q '^alpha ' <<<"$args" || ! grep -q '^user@beta ' <<<"$args"; then
    echo "FAIL: the stand-in ssh was not called once per rank with the host first: $args"; fail=1
elif grep -q '0123456789abcdef0123456789abcdef' <<<"$args"; then
    echo "FAIL: the job secret is on the remote shell's command line: $args"; fail=1
else
    echo "remote shell called as: $(head -n 1 <<<"$args" | cut -c1-110)..."
fi
[ $fail -eq 0 ] && echo "hostfile_parse: PASSED" || echo "hostfile_parse: FAILED"
exit $fail
