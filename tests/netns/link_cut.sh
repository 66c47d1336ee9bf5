#!/usr/bin/env bash
# link_cut.sh BENCH [silent] — two "hosts" as network namespaces joined by a veth pair; rank 0 in one, rank 1 in the
# other, all-reducing over TCP in a loop; then the link goes down mid-collective. With ZCCL_TIMEOUT_MS set, both ranks
# must fail with ZCCL_TIMEOUT naming the other rank within the deadline, instead of hanging (issue 6, link loss).
# "silent" (issue 17): no collective deadline (ZCCL_TIMEOUT_MS=0) and the far side's end of the link goes down, so
# rank 0 sees no reset, no error, nothing; TCP keepalive and TCP_USER_TIMEOUT (ZCCL_SOCKET_USER_TIMEOUT_MS, 2000 ms
# here: ZCCL_TEST_USER_TIMEOUT_MS) must make both ranks fail naming the other within 1.5 times that plus 3 s.
# Addresses live only inside the namespaces this script creates; everything is removed on exit, also on failure.
# Needs root and iproute2; otherwise prints SKIP and exits 77.
set -u
BENCH=${1:?usage: link_cut.sh path/to/zccl-bench [silent]}
MODE=${2:-deadline}
TIMEOUT_MS=${ZCCL_TEST_TIMEOUT_MS:-2000}
USER_TIMEOUT_MS=${ZCCL_TEST_USER_TIMEOUT_MS:-2000}
if [[ $MODE == silent ]]; then
  bound_ms=$(( USER_TIMEOUT_MS * 3 / 2 + 3000 ))
  zccl_timeout=0
else
  bound_ms=$(( TIMEOUT_MS + 8000 ))
  zccl_timeout=$TIMEOUT_MS
fi
tag=zc$$
ns0=${tag}a ns1=${tag}b
out=$(mktemp -d)
cleanup() {
  [[ -n "${p0:-}" ]] && kill -9 "$p0" 2>/dev/null
  [[ -n "${p1:-}" ]] && kill -9 "$p1" 2>/dev/null
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT
if [[ $(id -u) -ne 0 ]] || ! ip netns add "$ns0" 2>/dev/null; then
  echo "SKIP: needs root and 'ip netns' (iproute2) to create network namespaces"; exit 77
fi
ip netns add "$ns1" || exit 1
ip link add v0 netns "$ns0" type veth peer name v1 netns "$ns1" || exit 1
ip -n "$ns0" addr add 10.231.7.1/24 dev v0 && ip -n "$ns1" addr add 10.231.7.2/24 dev v1 || exit 1
ip -n "$ns0" link set v0 up && ip -n "$ns1" link set v1 up || exit 1
ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up

secret=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
common=(WORLD_SIZE=2 MASTER_ADDR=10.231.7.1 MASTER_PORT=29517 ZCCL_SECRET=$secret ZCCL_TRANSPORT=tcp
        ZCCL_TIMEOUT_MS=$zccl_timeout ZCCL_SOCKET_USER_TIMEOUT_MS=$USER_TIMEOUT_MS ZCCL_INIT_TIMEOUT_MS=20000)
run() { # ns rank
  ip netns exec "$1" env "${common[@]}" RANK="$2" "$BENCH" allreduce -b 4M -e 4M -n 1000000 -w 1 -c 0 \
    > "$out/r$2.out" 2> "$out/r$2.err" &
}
run "$ns0" 0; p0=$!
run "$ns1" 1; p1=$!
# Wait until the ranks are past init and running collectives (the benchmark prints its header then).
for _ in $(seq 100); do grep -q "out-of-place" "$out/r0.out" 2>/dev/null && break; sleep 0.1; done
sleep 1
t_cut=$(date +%s.%N)
if [[ $MODE == silent ]]; then ip -n "$ns1" link set v1 down; else ip -n "$ns0" link set v0 down; fi
deadline=$(( (bound_ms + 999) / 1000 ))
for _ in $(seq $((deadline * 10))); do
  kill -0 "$p0" 2>/dev/null || kill -0 "$p1" 2>/dev/null || break
  sleep 0.1
done
t_end=$(date +%s.%N)
fail=0
for r in 0 1; do
  pid_var=p$r; pid=${!pid_var}
  if kill -0 "$pid" 2>/dev/null; then echo "FAIL: rank $r still running $deadline s after the link went down (hang)"; fail=1; continue; fi
  wait "$pid"; rc=$?
  msg=$(grep -h "zccl" "$out/r$r.err" | tail -1)
  other=$((1 - r))
  if [[ $rc -eq 0 ]]; then echo "FAIL: rank $r exited 0 after the link went down"; fail=1
  elif ! grep -q "rank $other" <<<"$msg"; then echo "FAIL: rank $r's error does not name rank $other: $msg"; fail=1
  else echo "rank $r: exit $rc: $msg"; fi
done
awk -v a="$t_cut" -v b="$t_end" -v t="$zccl_timeout" -v u="$USER_TIMEOUT_MS" -v m="$MODE" 'BEGIN {
  printf "%s cut: link down -> both ranks gone: %.1f s (ZCCL_TIMEOUT_MS=%s, ZCCL_SOCKET_USER_TIMEOUT_MS=%s)\n", m, b - a, t, u }'
[[ $fail -eq 0 ]] && echo "link_cut: PASSED" || echo "link_cut: FAILED"
exit $fail
