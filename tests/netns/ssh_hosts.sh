#!/usr/bin/env bash
# ssh_hosts.sh ZCCLRUN ZCCL_BENCH — zcclrun's remote hosts ("ssh:HOST slots=M" in --hostfile) across 2 simulated
# hosts (network namespaces on a bridge, tests/netns/hosts.sh), with a stand-in for ssh: `--ssh agent`, where the
# agent takes "HOST COMMAND", enters the namespace whose address is HOST (with a hostname of its own, as
# `zcclrun`'s netns hosts have) and runs COMMAND there in a fresh environment, as sshd would for a login. What is
# checked: the ranks of each host run in that host's namespace with their RANK/LOCAL_RANK; the job secret reaches
# them (through the agent's stdin) but is on no command line the agent sees; MASTER_ADDR is the first host; and
# zccl-bench allreduce/allgather with every element checked (-c 1) succeeds across the hosts, with every rank
# connected over TCP to a rank of the other host. zcclrun --timeout is each run's deadline. Prints
# "ssh_hosts: PASSED" at the end. Needs root and iproute2 (and unshare); otherwise prints SKIP and exits 77.
# A real sshd is not started here (Debian's openssh-server needs its privilege-separation user installed): the
# agent stands in for ssh + sshd, which get exactly the same argv and stdin.
set -u
RUN=${1:?usage: ssh_hosts.sh ZCCLRUN ZCCL_BENCH}
BENCH=${2:?usage: ssh_hosts.sh ZCCLRUN ZCCL_BENCH}
DEADLINE=${SSH_HOSTS_DEADLINE_S:-180}
command -v unshare >/dev/null || { echo "SKIP: unshare (util-linux) not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_scratch out || exit 1
hosts_up 2; rc=$?
[ $rc -eq 0 ] || exit $rc

# The agent: "agent HOST COMMAND" -> COMMAND inside the namespace of the host with address HOST.
{
    echo '#!/bin/sh'
    echo 'printf "%s\n" "$*" >>"'"$out"'/agent_args"'
    echo 'case "$1" in'
    for i in 0 1; do echo "  ${HOST_ADDR[$i]}) ns=${HOST_NS[$i]} ;;"; done
    echo '  *) echo "agent: unknown host $1" >&2; exit 255 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" unshare --uts sh -c '"'"'hostname "$1"; exec env -i PATH="$2" HOME=/ sh -c "$3"'"'"' agent "$ns" "$PATH" "$2"'
} >"$out/agent"
chmod +x "$out/agent"
printf 'ssh:%s slots=2\nssh:%s slots=2\n' "${HOST_ADDR[0]}" "${HOST_ADDR[1]}" >"$out/hostfile"
fail=0

got=$(ZCCL_SECRET=00112233445566778899aabbccddeeff "$RUN" --hostfile "$out/hostfile" --ssh "$out/agent" \
      --timeout "$DEADLINE" sh -c 'echo "$RANK $LOCAL_RANK $(hostname) $MASTER_ADDR $ZCCL_SECRET"' 2>&1 | sort -n)
want=$(for r in 0 1 2 3; do echo "$r $((r % 2)) ${HOST_NS[$((r / 2))]} ${HOST_ADDR[0]} 00112233445566778899aabbccddeeff"; done)
if [ "$got" != "$want" ]; then
    echo "FAIL: placement over ssh hosts: got"; echo "$got"; echo "expected"; echo "$want"; fail=1
else
    echo "placement: 4 ranks, 2 per host, each in its host's namespace with the job secret and MASTER_ADDR ${HOST_ADDR[0]}"
fi
if grep -q 00112233445566778899aabbccddeeff "$out/agent_args"; then
    echo "FAIL: the job secret is on the remote shell's command line"; fail=1
fi

for op in allreduce allgather; do
    ZCCL_DEBUG=INFO ZCCL_DEBUG_SUBSYS=TCP "$RUN" --hostfile "$out/hostfile" --ssh "$out/agent" --timeout "$DEADLINE" \
        --tag-output "$BENCH" "$op" -b 8 -e 1M -f 32 -c 1 -n 2 -w 1 >"$out/$op.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "FAIL: $op over ssh hosts: exit status $rc"; grep -v "connected to rank" "$out/$op.out" | tail -n 15
        fail=1
        continue
    fi
    cross=$(awk 'match($0, /^\[[0-9]+\]/) && /connected to rank [0-9]+ over TCP/ {
            r = substr($0, 2, RLENGTH - 2) + 0; p = $0; sub(/.*connected to rank /, "", p); p = p + 0
            if (int(r / 2) != int(p / 2)) x[r] = 1 }
        END { c = 0; for (r = 0; r < 4; r++) c += (r in x); print c }' "$out/$op.out")
    rows=$(grep -c -E '^\[0\] +[0-9]+ ' "$out/$op.out")
    if [ "$cross" -ne 4 ] || [ "$rows" -lt 1 ]; then
        echo "FAIL: $op: $rows result rows, $cross of 4 ranks connected over TCP to the other host"; fail=1
        continue
    fi
    echo "$op: 2 ssh hosts x 2 ranks, $rows sizes checked (#wrong 0), 4/4 ranks crossed hosts over TCP"
done
[ $fail -eq 0 ] && echo "ssh_hosts: PASSED" || echo "ssh_hosts: FAILED"
exit $fail
