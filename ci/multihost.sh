#!/usr/bin/env bash
# Several "hosts" on one machine that share nothing but a bridge: each host has its own network,
# UTS (hostname), mount (/dev/shm, /proc, /sys), IPC and PID namespaces, joined to the others by
# veth pairs on a bridge in a private switch namespace. MPICH's hydra starts ranks in them through
# an ssh stand-in, so MPI treats them as separate nodes and moves bytes between them over TCP
# (with shared PID and IPC namespaces, UCX joined the "hosts" by cross-memory and shared-memory
# transports and eth0 carried nothing). Each host's namespaces are made once, by a holder process;
# the ssh stand-in enters them (nsenter), so every rank of one host shares that host's /dev/shm and
# IPC as on a real node. Addresses exist only on the links made here (10.77.0.0/24), with no route
# out; holders (and with them every process of a host), namespaces and hosts files go on exit.
#
#   bash ci/multihost.sh HOSTS RANKS_PER_HOST [pytest args...]     (as root; default: 2 1)
#   bash ci/multihost.sh HOSTS RANKS_PER_HOST --bench [bench args...]  (benchmarks/multihost_bench.py)
#   bash ci/multihost.sh HOSTS RANKS_PER_HOST --run COMMAND...         (any command)
#
# MPISYNC_LINK_RATE (a tc rate: 1gbit, 10gbit) shapes each host's link with a token bucket, as a
# cluster's slower network would: then communication costs what it costs between real nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=${1:-2}; per_host=${2:-1}; shift $(( $# > 2 ? 2 : $# )) || true
prefix=mpisync-mh
if [ "${1:-}" = --run ]; then
  shift; command=("$@")
elif [ "${1:-}" = --bench ]; then
  shift; command=(python benchmarks/multihost_bench.py "$@")
else
  tests=("$@"); [ ${#tests[@]} -gt 0 ] || tests=(tests/contract/test_sync_params.py tests/contract/test_errors.py tests/contract/test_sync_state.py tests/contract/test_allreduce.py tests/contract/test_multihost.py)
  command=(python ci/mpi_pytest.py -q "${tests[@]}")
fi

if [ "$(id -u)" != 0 ]; then echo "multihost: needs root (network namespaces); skipped"; exit 0; fi
if ! command -v ip >/dev/null || ! command -v unshare >/dev/null || ! command -v nsenter >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq iproute2 util-linux) >/dev/null 2>&1 || true
fi
command -v ip >/dev/null || { echo "multihost: iproute2 is missing and could not be installed"; exit 1; }
command -v nsenter >/dev/null || { echo "multihost: nsenter (util-linux) is missing and could not be installed"; exit 1; }
if ! ip netns add "$prefix-probe" 2>/tmp/mpisync-mh-probe.err; then
  echo "multihost: network namespaces are not permitted here ($(cat /tmp/mpisync-mh-probe.err)); skipped"
  exit 0
fi
ip netns del "$prefix-probe"
if ! unshare --uts --ipc --mount --pid --fork --mount-proc true 2>/tmp/mpisync-mh-probe.err; then
  echo "multihost: IPC/PID namespaces are not permitted here ($(cat /tmp/mpisync-mh-probe.err)); skipped"
  exit 0
fi
. .venv/bin/activate

holders=(); state=""
cleanup() {
  # SIGKILL to a holder (PID 1 of its host's PID namespace) ends every process left on that host.
  for pid in "${holders[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-" || true); do ip netns del "$ns" || true; done
  rm -rf /etc/netns/"$prefix"-* ${state:+"$state"}
}
cleanup
state=$(mktemp -d /tmp/mpisync-mh-state.XXXXXX)
trap cleanup EXIT

ip netns add "$prefix-sw"
ip -n "$prefix-sw" link add br0 type bridge
ip -n "$prefix-sw" link set br0 up
names=()
for i in $(seq 1 "$hosts") 254; do
  ns=$prefix-h$i; [ "$i" = 254 ] && ns=$prefix-head || names+=("$ns")
  ip netns add "$ns"
  ip link add "mhv$i-$$" type veth peer name eth0 netns "$ns"
  ip link set "mhv$i-$$" netns "$prefix-sw"
  ip -n "$prefix-sw" link set "mhv$i-$$" master br0 up
  ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  if [ -n "${MPISYNC_LINK_RATE:-}" ] && [ "$i" != 254 ]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$MPISYNC_LINK_RATE" burst 256kb latency 20ms
  fi
  mkdir -p "/etc/netns/$ns"   # ip netns exec bind-mounts this over /etc/hosts (and remounts /sys for the namespace)
  { echo "127.0.0.1 localhost"; echo "10.77.0.254 $prefix-head"
    for j in $(seq 1 "$hosts"); do echo "10.77.0.$j $prefix-h$j"; done; } > "/etc/netns/$ns/hosts"
  [ "$i" != 254 ] || continue
  # The holder: PID 1 of the host's PID namespace, in its own UTS, IPC and mount namespaces,
  # with a private /dev/shm as on real nodes; once ready it touches a file, and nsenter targets its PID.
  ip netns exec "$ns" unshare --uts --ipc --mount --pid --fork --mount-proc --kill-child sh -c \
    "mount -t tmpfs -o size=512m tmpfs /dev/shm && hostname $ns && touch $state/$ns.ready && exec sleep infinity" &
  holders+=($!); disown $!   # no "Killed" notice when cleanup ends it
done
for i in "${!names[@]}"; do
  ns=${names[$i]}
  for _ in $(seq 100); do [ -e "$state/$ns.ready" ] && break; sleep 0.1; done
  [ -e "$state/$ns.ready" ] || { echo "multihost: host $ns did not start"; exit 1; }
  # unshare --fork: the holder is the only child of the unshare process started above.
  child=$(cat "/proc/${holders[$i]}/task/${holders[$i]}/children" 2>/dev/null || pgrep -P "${holders[$i]}" || true)
  child=$(echo $child | awk '{print $1}')
  [ -n "$child" ] || { echo "multihost: no holder process for $ns"; exit 1; }
  echo "$child" > "$state/$ns.pid"
done

# hydra calls the stand-in like ssh: [options] HOST COMMAND...; COMMAND runs inside HOST's namespaces.
cat > "$state/ssh" <<WRAP
#!/bin/bash
while [[ "\$1" == -* ]]; do shift; done
host=\$1; shift
exec nsenter -t "\$(cat $state/\$host.pid)" --net --uts --ipc --pid --mount sh -c "cd '\$PWD' && exec \$*"
WRAP
chmod +x "$state/ssh"

host_list=$(IFS=,; echo "${names[*]/%/:$per_host}")
n=$((hosts * per_host))
echo "== multihost: $hosts hosts x $per_host ranks over TCP ($host_list)${MPISYNC_LINK_RATE:+, links shaped to $MPISYNC_LINK_RATE}"
# mpiexec runs on a head node of its own on the bridge (network and hostname only): every host is
# then remote to hydra and started through the stand-in (a host of its own would be forked directly).
timeout 900 ip netns exec "$prefix-head" unshare --uts sh -c "hostname $prefix-head && \
  HYDRA_LAUNCHER=ssh MPIEXEC_TIMEOUT=840 MPISYNC_TEST_LOGS=.test-logs/multihost MPISYNC_EXPECT_NODES=$hosts \
  exec mpiexec -launcher ssh -launcher-exec $state/ssh -hosts $host_list -n $n $(printf "%q " "${command[@]}")"
