"""mpisync.torch's public names: the backend's errors importable from the package, each an
mpisync error and a RuntimeError; one that ranks agree on raised by the backend as that type."""

import pytest

import mpisync

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync.torch  # noqa: E402  (registers the backend)

_ERRORS = {
    "ArgumentError": mpisync.InvalidParamError,
    "MismatchError": mpisync.ManifestMismatchError,
    "CountError": mpisync.SyncError,
    "GroupTimeoutError": mpisync.SyncTimeoutError,
    "OperationError": mpisync.SyncError,
    "OperationTimeoutError": mpisync.SyncTimeoutError,
    "WaitTimeoutError": mpisync.SyncTimeoutError,
}


@pytest.mark.parametrize("name", sorted(_ERRORS))
def test_each_backend_error_is_exported_as_an_mpisync_error_and_a_runtime_error(name):
    from mpisync.torch import communicators, errors

    error = getattr(mpisync.torch, name)
    assert name in mpisync.torch.__all__
    defined_in = communicators if name == "GroupTimeoutError" else errors
    assert error is getattr(defined_in, name)
    assert issubclass(error, _ERRORS[name]) and issubclass(error, RuntimeError)


def test_every_public_name_resolves():
    for name in mpisync.torch.__all__:
        assert getattr(mpisync.torch, name) is not None, name
    assert mpisync.torch.BACKEND_NAME == "mpisync"


@pytest.mark.mpi
def test_a_refused_operation_raises_the_exported_type(comm):
    group = mpisync.torch.ProcessGroupMPISync(comm, timeout=60)
    try:
        with pytest.raises(mpisync.torch.ArgumentError, match="monitored_barrier"):
            group.monitored_barrier()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.BAND
        with pytest.raises(mpisync.torch.ArgumentError, match="integer tensors"):
            group.allreduce([torch.ones(2)], opts).wait()
        tensor = torch.ones(3)
        group.allreduce([tensor]).wait()  # the refusals posted nothing: the next one matches
        assert tensor.tolist() == [float(comm.size)] * 3
    finally:
        group.shutdown()
