"""Horovod's names: the build queries, the error types, the lazily imported collectives."""

import pytest

import mpisync

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi


def test_build_queries_answer_as_horovod_on_mpi():
    assert hvd.mpi_built() and hvd.mpi_enabled()
    assert not (hvd.gloo_built() or hvd.gloo_enabled() or hvd.ccl_built() or hvd.ddl_built())
    assert hvd.nccl_built() == 0 and not hvd.rocm_built()
    assert hvd.cuda_built() == torch.cuda.is_available()


def test_error_types_are_horovods_and_mpisyncs():
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert issubclass(hvd.HorovodInternalError, mpisync.SyncError)
    assert issubclass(hvd.HorovodArgumentError, ValueError)
    assert issubclass(hvd.HorovodArgumentError, mpisync.InvalidParamError)


def test_differentiable_names_are_the_autograd_module():
    from mpisync.horovod import autograd

    assert set(hvd.DIFFERENTIABLE) == set(autograd.__all__)
    assert set(hvd.DIFFERENTIABLE) <= set(hvd.__all__)
    assert all(hasattr(hvd, name) for name in hvd.__all__)
