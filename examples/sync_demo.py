"""The main job: sync a ResNet-50 parameter set from rank 0 to every rank, and show it worked.

    mpiexec -n 2 python examples/sync_demo.py [--steps N]

Each rank starts with different values (as after independent initialisation);
after the sync every rank prints the same digest. With torch installed the
parameters are torch CPU tensors, as in ``model.state_dict()``; otherwise numpy.
"""

import argparse
import hashlib

import numpy as np
from mpi4py import MPI

import mpisync
from mpisync.tools.workloads import make_params, workload


def digest(params) -> bytes:
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(params):
        h.update(np.asarray(params[name]).tobytes())
    return h.digest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="repeated syncs through one ParamSync")
    parser.add_argument("--workload", default="resnet50")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    try:
        import torch  # noqa: F401

        library = "torch"
    except ImportError:
        library = "numpy"
    params = make_params(workload(args.workload), comm.rank, library)
    before = digest(params)
    with mpisync.ParamSync(comm, root=0) as syncer:
        for step in range(args.steps):
            report = syncer.sync(params, verify=(step == 0))
            if comm.rank == 0:
                print(f"step {step}: {report.summary()}", flush=True)
    after = digest(params)
    # Rank 0 prints every rank's digests, in rank order (fixed-size bytes, gathered: no
    # interleaving).
    digests = np.empty((comm.size, 16), np.uint8)
    comm.Gather(np.frombuffer(before + after, np.uint8), digests, root=0)
    if comm.rank == 0:
        same = bool((digests[:, 8:] == digests[0, 8:]).all())
        for rank, row in enumerate(digests):
            print(
                f"rank {rank}: {library} {args.workload}: {report.tensors} tensors, "
                f"{report.bytes / 1e6:.1f} MB; "
                f"digest before {row[:8].tobytes().hex()} after {row[8:].tobytes().hex()}"
            )
        print(f"identical on every rank: {same}", flush=True)


if __name__ == "__main__":
    main()
