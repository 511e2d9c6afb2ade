"""The ``started`` fixture of the mpisync.horovod tests: ``hvd.init(comm)``, then shutdown."""

import pytest

hvd = pytest.importorskip("mpisync.horovod")
pytest.importorskip("torch")


@pytest.fixture
def started(comm):
    hvd.init(comm)
    yield comm
    hvd.shutdown()
