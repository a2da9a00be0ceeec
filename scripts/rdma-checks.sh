#!/bin/sh
# Runs *inside* the Soft-RoCE VM (busybox sh), from scripts/rdma-ci: every
# RDMA check of the project against the kernel's real verbs stack (rxe0).
# Prints one line per check and exits non-zero if any failed.
fails=0
t0=$(date +%s)
at() { echo "at $(( $(date +%s) - t0 )) s"; }
pass() { echo "PASS $1 ($(at))"; }
fail() { echo "FAIL $1 ($(at))"; fails=$((fails + 1)); }
show() { sed 's/^/    | /' "$1" | tail -${2:-8}; }

ibv_devinfo -l | grep -q rxe0 && pass "rxe0 is a verbs device" || fail "no rxe0"

# 0. Link-level tests (transport-rdma/tests/verbs.rs): stream integrity and
#    the credit window, zero-copy from registered memory, a closed peer, a
#    failed work completion naming the verb and status, sleeping on the
#    completion channel, strangers at the setup port, closing (abort) with
#    zero-copy writes in flight, one-sided reads (order, chunks, refusals).
rdma-link-tests --test-threads=1 --nocapture >/tmp/lt.txt 2>&1
if [ $? = 0 ] && grep -q "test result: ok. 8 passed" /tmp/lt.txt && ! grep -q skipped /tmp/lt.txt; then
  pass "link tests (8) on rxe0"; grep -E "window full|after .*:|waited|one-sided:" /tmp/lt.txt | sed 's/^/    | /'
else
  fail "link tests"; show /tmp/lt.txt 30
fi

# 1. The correctness matrix over RDMA: every collective x dtype x op, in and
#    out of place, counts 0, 1, 7, n-1, n+1 and 100003 elements.
for n in 2 3 4; do
  OXCCL_TRANSPORT=rdma OXCCL_DEBUG=info oxrun -n $n oxccl-selftest matrix 100003 >/tmp/m$n.txt 2>&1
  if [ $? = 0 ] && grep -q "matrix OK: $n ranks" /tmp/m$n.txt && grep -q "links=\"rdma:$((n - 1))\"" /tmp/m$n.txt; then
    pass "matrix over rdma, $n ranks"
  else
    fail "matrix over rdma, $n ranks"; show /tmp/m$n.txt
  fi
done

# 1b. Device and GID selection knobs.
OXCCL_DEBUG=info OXCCL_TRANSPORT=rdma OXCCL_IB_HCA==rxe0:1 OXCCL_IB_GID_INDEX=1 oxrun -n 2 oxccl-selftest init >/tmp/k1.txt 2>&1 \
  && grep -q "using rxe0 port 1, RoCE, GID index Some(1)" /tmp/k1.txt \
  && pass "OXCCL_IB_HCA==rxe0:1 OXCCL_IB_GID_INDEX=1" || { fail "explicit device and GID"; show /tmp/k1.txt; }
OXCCL_TRANSPORT=rdma OXCCL_IB_HCA=^rxe oxrun -n 2 oxccl-selftest init >/tmp/k2.txt 2>&1
[ $? != 0 ] && grep -q "no RDMA device was found" /tmp/k2.txt && grep -q OXCCL_IB_HCA /tmp/k2.txt \
  && pass "OXCCL_IB_HCA=^rxe excludes the only device: clear error" || { fail "excluded device"; show /tmp/k2.txt; }
OXCCL_TRANSPORT=rdma OXCCL_IB_GID_INDEX=99 oxrun -n 2 oxccl-selftest init >/tmp/k3.txt 2>&1
[ $? != 0 ] && grep -q "OXCCL_IB_GID_INDEX=99" /tmp/k3.txt \
  && pass "OXCCL_IB_GID_INDEX=99 (no such GID): clear error" || { fail "bad GID index"; show /tmp/k3.txt; }
OXCCL_HOSTID=x OXCCL_IB_HCA=^rxe OXCCL_DEBUG=info oxrun -n 2 sh -c 'OXCCL_HOSTID=h$OXCCL_RANK exec oxccl-selftest init' >/tmp/k4.txt 2>&1 \
  && grep -q "no RDMA device found; peers on other hosts use TCP" /tmp/k4.txt && grep -q 'links="tcp:1"' /tmp/k4.txt \
  && pass "no usable device: automatic choice falls back to TCP" || { fail "fallback to TCP"; show /tmp/k4.txt; }

# 2. Automatic choice on a pretend two-host job (ranks 0,1 on host a; 2,3 on
#    host b): shared memory inside a host, RDMA between hosts, one matrix.
oxrun -n 4 sh -c 'OXCCL_DEBUG=info OXCCL_HOSTID=h$((OXCCL_RANK / 2)) exec oxccl-selftest matrix 100003' >/tmp/mixed.txt 2>&1
if [ $? = 0 ] && grep -q "matrix OK: 4 ranks" /tmp/mixed.txt && [ "$(grep -c 'links="shm:1 rdma:2"' /tmp/mixed.txt)" = 4 ]; then
  pass "auto choice: shm within a host, rdma across hosts (4 ranks, 2 hosts)"
else
  fail "auto choice shm + rdma"; show /tmp/mixed.txt
fi

# 3. SIGKILL of a rank mid-transfer: every survivor reports PeerLost naming it.
#    Ranks are started directly (oxrun would stop the survivors itself).
port=29600
kill_check() {  # KIND VICTIM MODE
  kind=$1; victim=$2; mode=$3
  port=$((port + 1)); rm -f /tmp/f*.txt
  for r in 0 1 2; do
    OXCCL_ROOT=127.0.0.1:$port OXCCL_RANK=$r OXCCL_WORLD_SIZE=3 OXCCL_TRANSPORT=rdma OXCCL_TIMEOUT=60 \
      timeout 90 oxccl-selftest fault $kind 8M $victim $mode >/tmp/f$r.txt 2>&1 &
  done
  wait
  ok=1
  died=$(awk '/^DYING/ {print $3}' /tmp/f$victim.txt)
  for r in 0 1 2; do
    [ $r = $victim ] && continue
    # ERROR <rank> <epoch ms> <blamed rank> <kind of error>
    read -r _ _ at blamed what <<EOT
$(grep '^ERROR' /tmp/f$r.txt)
EOT
    if [ "$blamed" = "$victim" ] && [ "$what" = PeerLost ]; then
      echo "    rank $r: PeerLost naming rank $victim after $((at - died)) ms: $(grep '^DETAIL' /tmp/f$r.txt | cut -c1-160)"
    else
      ok=0; show /tmp/f$r.txt
    fi
  done
  [ $ok = 1 ] && pass "SIGKILL of rank $victim in $kind ($mode): survivors report PeerLost naming it" || fail "SIGKILL of rank $victim in $kind ($mode)"
}
for victim in 1 2; do
  for mode in early mid; do kill_check all_reduce $victim $mode; done
done
for kind in all_gather reduce_scatter broadcast send_recv registered_all_reduce; do kill_check $kind 1 mid; done

# 4. The benchmark over RDMA, every element checked (#wrong 0, exit 0).
oxrun -n 2 --no-prefix all_reduce_perf --transport rdma -b 8 -e 16M -f 4 -c 1 -n 5 -w 2 >/tmp/perf.txt 2>&1
if [ $? = 0 ] && grep -q "Out of bounds values : 0 OK" /tmp/perf.txt; then
  pass "all_reduce_perf --transport rdma, 2 ranks, #wrong 0"; show /tmp/perf.txt 20
else
  fail "all_reduce_perf --transport rdma"; show /tmp/perf.txt 20
fi

# 5. Direct access over RDMA: collectives on alloc_shared buffers read
#    peers' memory with RDMA READ (the `direct` algorithm, phases as
#    zero-length messages); every direct collective x dtype x op, in and
#    out of place, exact, and the algorithm that ran checked.
#    Forced (OXCCL_ALGO=direct): every size runs direct. Automatic: calls
#    above OXCCL_ONESHOT_BYTES (16 KiB) run direct, smaller ones as messages.
#    (2 ranks up to 4 MiB: reads of several 1 MiB chunks.)
for n in 2 3; do
  OXCCL_ALGO=direct OXCCL_TRANSPORT=rdma OXCCL_DEBUG=debug oxrun -n $n oxccl-selftest registered $((6 / n))M direct >/tmp/d$n.txt 2>&1
  if [ $? = 0 ] && grep -q "registered OK: $n ranks, direct Bytes(0)" /tmp/d$n.txt && grep -q "first one-sided read" /tmp/d$n.txt; then
    pass "direct access over rdma (one-sided reads), $n ranks"; grep "registered OK" /tmp/d$n.txt | sed 's/^/    | /'
  else
    fail "direct access over rdma, $n ranks"; show /tmp/d$n.txt 20
  fi
done
OXCCL_TRANSPORT=rdma oxrun -n 3 oxccl-selftest registered-mismatch >/tmp/dm.txt 2>&1
if [ $? = 0 ] && [ "$(grep -c 'MISMATCH' /tmp/dm.txt)" = 3 ]; then
  pass "direct access over rdma: another registered buffer on one rank is a Mismatch on all 3"; grep MISMATCH /tmp/dm.txt | head -2 | cut -c1-200 | sed 's/^/    | /'
else
  fail "registered-buffer mismatch over rdma"; show /tmp/dm.txt 12
fi
# Two pretend hosts, automatic transport choice: RDMA serves every peer, so
# registered buffers are reached one-sided as well.
oxrun -n 2 --no-prefix sh -c 'OXCCL_HOSTID=h$OXCCL_RANK exec oxccl-selftest registered 256K direct-from=16385' >/tmp/dh.txt 2>&1 \
  && grep -q "registered OK: 2 ranks, direct Bytes(16385)" /tmp/dh.txt \
  && pass "direct access over rdma on two pretend hosts, automatic choice (direct above 16 KiB)" || { fail "direct access, two pretend hosts"; show /tmp/dh.txt 20; }
oxrun -n 2 --no-prefix all_reduce_perf --transport rdma --registered --algo direct -b 8 -e 16M -f 8 -c 1 -n 5 -w 2 >/tmp/dperf.txt 2>&1
if [ $? = 0 ] && grep -q "Out of bounds values : 0 OK" /tmp/dperf.txt; then
  pass "all_reduce_perf --registered over rdma (direct), #wrong 0"; show /tmp/dperf.txt 12
else
  fail "all_reduce_perf --registered over rdma (direct)"; show /tmp/dperf.txt 20
fi

# 5b. Zero-copy sends from registered buffers: the ring forced on them
#    (two pretend hosts), so they travel as messages straight from memory.
oxrun -n 2 --no-prefix sh -c 'OXCCL_DEBUG=debug OXCCL_HOSTID=h$OXCCL_RANK exec all_reduce_perf --registered --algo ring -b 1M -e 16M -f 4 -c 1 -n 5 -w 2' >/tmp/zc.txt 2>&1
if [ $? = 0 ] && grep -q "Out of bounds values : 0 OK" /tmp/zc.txt && grep -q "first zero-copy send" /tmp/zc.txt; then
  pass "zero-copy from registered buffers, #wrong 0"; grep -v "Z  *[A-Z]" /tmp/zc.txt >/tmp/zc2.txt; show /tmp/zc2.txt 8
else
  fail "zero-copy from registered buffers"; show /tmp/zc.txt 20
fi

oxrun -n 2 sh -c 'OXCCL_DEBUG=debug OXCCL_HOSTID=h$OXCCL_RANK exec oxccl-selftest registered-memory 4M' >/tmp/rm.txt 2>&1
if [ $? = 0 ] && grep -q "registration active: true" /tmp/rm.txt && grep -q "first zero-copy send" /tmp/rm.txt; then
  pass "zero-copy from register_memory'd Vecs (overlap refused), exact"
else
  fail "register_memory"; show /tmp/rm.txt 20
fi

# 6. Many small checked calls and a random soak (flow control under load).
OXCCL_TRANSPORT=rdma oxrun -n 3 oxccl-selftest soak 400 11 >/tmp/soak.txt 2>&1 && pass "soak, 400 random calls on 3 ranks" || { fail "soak"; show /tmp/soak.txt; }
OXCCL_TRANSPORT=rdma oxrun -n 4 oxccl-selftest small 2000 >/tmp/small.txt 2>&1 && { pass "2000 small all_reduces on 4 ranks"; show /tmp/small.txt 2; } || { fail "small"; show /tmp/small.txt; }

# 7. Reference figures on the same emulated device (not checks): the verbs
#    example's raw RC throughput, and oxccl over TCP on the VM's loopback.
echo "reference: ibv_rc_pingpong, 1 MiB messages (rxe under QEMU emulation):"
ibv_rc_pingpong -d rxe0 -g 1 -s 1048576 -n 50 >/tmp/pp_s.txt 2>&1 &
sleep 1
ibv_rc_pingpong -d rxe0 -g 1 -s 1048576 -n 50 127.0.0.1 2>&1 | grep -i "bytes in" | sed 's/^/    | /'
wait
echo "reference: ibv_rc_pingpong, 8-byte messages (round trip per iteration):"
ibv_rc_pingpong -d rxe0 -g 1 -s 8 -n 2000 >/tmp/pp_s.txt 2>&1 &
sleep 1
ibv_rc_pingpong -d rxe0 -g 1 -s 8 -n 2000 127.0.0.1 2>&1 | grep -i "iters in" | sed 's/^/    | /'
wait
echo "reference: all_reduce_perf over TCP in the same VM:"
oxrun -n 2 --no-prefix all_reduce_perf --transport tcp -b 8 -e 16M -f 8 -c 1 -n 5 -w 2 2>&1 | grep -E "^ +[0-9]" | sed 's/^/    | /'

echo "rdma checks: $fails failed, $(( $(date +%s) - t0 )) s"
[ $fails = 0 ]
