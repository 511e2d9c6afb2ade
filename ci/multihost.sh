#!/usr/bin/env bash
# Several "hosts" on one machine: each host is a network namespace with its own hostname,
# joined to the others by veth pairs on a bridge in a private switch namespace; MPICH's
# hydra starts ranks in them through an ssh stand-in, so MPI treats them as separate nodes
# and talks TCP between them. Addresses exist only on the links made here (10.77.0.0/24),
# with no route out; namespaces and their hosts files are removed on exit.
#
#   bash ci/multihost.sh HOSTS RANKS_PER_HOST [pytest args...]     (as root; default: 2 1)
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=${1:-2}; per_host=${2:-1}; shift $(( $# > 2 ? 2 : $# )) || true
tests=("$@"); [ ${#tests[@]} -gt 0 ] || tests=(tests/test_sync.py tests/test_errors.py tests/test_state.py tests/test_multihost.py)
prefix=mpisync-mh

if [ "$(id -u)" != 0 ]; then echo "multihost: needs root (network namespaces); skipped"; exit 0; fi
if ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq iproute2 util-linux) >/dev/null 2>&1 || true
fi
command -v ip >/dev/null || { echo "multihost: iproute2 is missing and could not be installed"; exit 1; }
if ! ip netns add "$prefix-probe" 2>/tmp/mpisync-mh-probe.err; then
  echo "multihost: network namespaces are not permitted here ($(cat /tmp/mpisync-mh-probe.err)); skipped"
  exit 0
fi
ip netns del "$prefix-probe"
. .venv/bin/activate

cleanup() {
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-" || true); do ip netns del "$ns" || true; done
  rm -rf /etc/netns/"$prefix"-* "$wrapper"
}
wrapper=$(mktemp /tmp/mpisync-mh-ssh.XXXXXX)
cleanup
trap cleanup EXIT

ip netns add "$prefix-sw"
ip -n "$prefix-sw" link add br0 type bridge
ip -n "$prefix-sw" link set br0 up
names=()
for i in $(seq 1 "$hosts"); do
  ns=$prefix-h$i; names+=("$ns")
  ip netns add "$ns"
  ip link add "mhv$i-$$" type veth peer name eth0 netns "$ns"
  ip link set "mhv$i-$$" netns "$prefix-sw"
  ip -n "$prefix-sw" link set "mhv$i-$$" master br0 up
  ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  mkdir -p "/etc/netns/$ns"   # ip netns exec bind-mounts this over /etc/hosts inside the namespace
  { echo "127.0.0.1 localhost"; for j in $(seq 1 "$hosts"); do echo "10.77.0.$j $prefix-h$j"; done; } > "/etc/netns/$ns/hosts"
done

cat > "$wrapper" <<'WRAP'
#!/bin/bash
# hydra calls this like ssh: [options] HOST COMMAND...; run COMMAND in HOST's namespace under its name
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
# a private /dev/shm per host, as on real nodes: ranks on one host share it, other hosts do not
exec ip netns exec "$host" unshare --uts --mount sh -c "mount -t tmpfs -o size=256m tmpfs /dev/shm && hostname $host && exec $*"
WRAP
chmod +x "$wrapper"

host_list=$(IFS=,; echo "${names[*]/%/:$per_host}")
n=$((hosts * per_host))
echo "== multihost: $hosts hosts x $per_host ranks over TCP ($host_list)"
# mpiexec itself runs on host 1, so every proxy can reach it.
timeout 900 ip netns exec "${names[0]}" unshare --uts sh -c "hostname ${names[0]} && \
  HYDRA_LAUNCHER=ssh MPIEXEC_TIMEOUT=840 MPISYNC_TEST_LOGS=.test-logs/multihost MPISYNC_EXPECT_NODES=$hosts \
  $(command -v mpiexec) -launcher ssh -launcher-exec $wrapper -hosts $host_list -n $n \
  $(command -v python) ci/mpi_pytest.py -q ${tests[*]}"
