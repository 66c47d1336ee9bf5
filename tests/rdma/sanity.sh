#!/bin/sh
# sanity.sh — runs inside the soft-RoCE VM (tests/rdma/run_vm.sh -- sh tests/rdma/sanity.sh): the reference tools
# between rxe1 (server, 10.77.0.2) and rxe0 (client, 10.77.0.1), so packets cross the veth pair:
#   ibv_rc_pingpong  plain verbs, RC QP, GID index 1 (the IPv4-mapped RoCE v2 GID)
#   rping            rdma_cm connection setup and RDMA READ/WRITE, data verified (-V)
#   ib_write_bw      perftest RDMA WRITE bandwidth (emulated machine: a sanity number, not a speed); QP timeout
#                    -u 20 (4.3 s): under emulation on a busy host the default 67 ms can run out of retries
# Each server runs in the background with a timeout; prints "sanity: PASSED" and exits 0 when all three pass.
fail=0
step() { # name status
  if [ "$2" -eq 0 ]; then echo "sanity: $1 ok"; else echo "sanity: $1 FAILED (status $2)"; fail=1; fi
}
srv_wait() { # pid: the server must have exited 0 too
  timeout 30 sh -c "while kill -0 $1 2>/dev/null; do sleep 0.2; done"
  wait "$1"
}

timeout 60 ibv_rc_pingpong -d rxe1 -g 1 -n 100 -s 4096 > /tmp/pp_srv.out 2>&1 &
s=$!
sleep 1
timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 100 -s 4096 10.77.0.2; c=$?
srv_wait $s; sv=$?
cat /tmp/pp_srv.out
step "ibv_rc_pingpong rxe0 -> rxe1 (100 x 4 KiB)" $((c | sv))

timeout 60 rping -s -a 10.77.0.2 -C 20 -S 4096 -V > /tmp/rping_srv.out 2>&1 &
s=$!
sleep 1
timeout 60 rping -c -a 10.77.0.2 -I 10.77.0.1 -C 20 -S 4096 -V; c=$?
srv_wait $s; sv=$?
cat /tmp/rping_srv.out
step "rping (rdma_cm, 20 verified round trips of 4 KiB)" $((c | sv))

timeout 90 ib_write_bw -d rxe1 -x 1 -u 20 -s 65536 -n 200 -F > /tmp/bw_srv.out 2>&1 &
s=$!
sleep 1
timeout 90 ib_write_bw -d rxe0 -x 1 -u 20 -s 65536 -n 200 -F 10.77.0.2 > /tmp/bw_cli.out 2>&1; c=$?
srv_wait $s; sv=$?
cat /tmp/bw_cli.out
bw=$(awk '$1 == 65536 { print $4 }' /tmp/bw_cli.out)
echo "sanity: ib_write_bw 64 KiB x 200: ${bw:-?} MB/s average (emulated VM, not a speed)"
step "ib_write_bw" $((c | sv))

[ $fail -eq 0 ] && echo "sanity: PASSED" || echo "sanity: FAILED"
exit $fail
