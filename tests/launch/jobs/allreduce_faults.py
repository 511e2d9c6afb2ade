"""Faults for the all-reduce and the torch backend: the last rank never joins (run by
tests/launch/test_allreduce_faults.py).

``python allreduce_faults.py KIND``: KIND is ``gradsync`` (mpisync.allreduce), ``gradsync-stall``
(the last rank agrees, then never posts its all-reduces), ``backend``
(torch all_reduce, which aborts) or ``backend-raise`` (MPISYNC_TIMEOUT_ABORT=0: the wait raises);
``thread-level`` is no fault: the backend at whatever thread level MPI gave; nor is
``torch-rendezvous``: ``torch.distributed.init_process_group("mpisync")`` with torch's TCP
rendezvous.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import mpisync

kind = sys.argv[1]
comm = MPI.COMM_WORLD
victim = comm.rank == comm.size - 1
pids = comm.allgather(os.getpid())  # one node: the victim watches the others end


def _running(pid: int) -> bool:
    try:  # a zombie (exited, not yet reaped by the launcher) counts as ended
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _outlive_the_others(seconds: float) -> None:
    """The victim's stay (it never joins): ``seconds``, or until every other rank has ended, so that
    a launcher slow to end the job after a rank aborted or exited cannot keep it alive."""
    others = [pid for pid in pids if pid != os.getpid()]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(_running(pid) for pid in others):
            os._exit(4)  # the others are gone: MPI_Finalize would wait for them
        time.sleep(0.2)


def _report_and_leave(line: str) -> None:
    """The end of a kind with no fault: this rank's ``line``, then torch's group is destroyed and
    the rank exits."""
    import torch.distributed as dist

    print(line, flush=True)
    dist.destroy_process_group()
    sys.exit(0)


if kind == "thread-level":
    import torch
    import torch.distributed as dist

    import mpisync.torch

    mpisync.torch.init_process_group()
    tensors = [torch.full((n,), float(comm.rank + 1)) for n in (10, 100000)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    [w.wait() for w in works]
    total = sum(range(1, comm.size + 1))
    ok = all(bool(torch.all(t == total)) for t in tensors)
    _report_and_leave(
        f"rank {comm.rank}: thread level {MPI.Query_thread()}, threaded "
        f"{dist.group.WORLD.threaded}, correct {ok}"
    )
if kind == "torch-rendezvous":
    import socket

    import torch
    import torch.distributed as dist

    import mpisync.torch  # noqa: F401  (registers the backend)

    # A free port below the kernel's ephemeral range: a port the kernel hands out itself (bind to
    # port 0) may go to another socket of the job before torch's store listens on it.
    port = np.zeros(1, np.int64)
    if comm.rank == 0:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            first_ephemeral = int(ports.read().split()[0])
        rng = np.random.default_rng()
        for candidate in rng.permutation(np.arange(10000, max(10001, first_ephemeral))):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", int(candidate)))
                except OSError:
                    continue
            port[0] = candidate
            break
    comm.Bcast(port, 0)
    dist.init_process_group(
        "mpisync",
        init_method=f"tcp://127.0.0.1:{int(port[0])}",
        rank=comm.rank,
        world_size=comm.size,
    )
    tensor = torch.full((4,), float(comm.rank))
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    _report_and_leave(f"rank {comm.rank}: backend {dist.get_backend()}, max {tensor.tolist()}")
if kind == "gradsync":
    grads = {"layer0.weight": np.ones(1000, np.float32), "layer1.bias": np.ones(10, np.float32)}
    mpisync.allreduce(grads, comm, timeout=30)  # every rank once: the communicator is set up
    if not victim:
        mpisync.allreduce(grads, comm, timeout=3)
elif kind == "gradsync-stall":
    from mpisync.allreduce.transport import ReduceTransport

    # float64 first: "a.big" (over fusion_bytes) is the first collective, "b.small" the second
    grads = {"a.big": np.ones(100000), "b.small": np.ones(10, np.float32)}
    mpisync.allreduce(grads, comm, timeout=30)
    if victim:  # agrees on the manifests, then stays out of the collectives
        ReduceTransport.run = lambda self, program, ctx: _outlive_the_others(60)
    # one collective in flight: the wait for "a.big" expires before "b.small" is posted
    mpisync.allreduce(grads, comm, timeout=3, max_concurrent=1)
else:
    import torch
    import torch.distributed as dist

    import mpisync.torch

    mpisync.torch.init_process_group(timeout=3)
    tensor = torch.ones(1000)
    dist.all_reduce(tensor)
    if not victim:
        try:
            dist.all_reduce(tensor)
        except Exception as exc:  # MPISYNC_TIMEOUT_ABORT=0 only
            print(f"rank {comm.rank} raised {type(exc).__name__}: {exc}", flush=True)
            os._exit(3)  # a collective is still pending: MPI_Finalize could wait for it
if victim:
    _outlive_the_others(60)
print(f"rank {comm.rank} finished", flush=True)
