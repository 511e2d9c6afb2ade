"""Unit tests of mpisync.config.resolve: where each setting comes from, and bad values refused."""

import pytest

from mpisync import InvalidParamError
from mpisync.config import resolve


def test_settings_sources(monkeypatch):
    monkeypatch.delenv("MPISYNC_MAX_CONCURRENT", raising=False)
    monkeypatch.setenv("MPISYNC_FUSION_BYTES", "4096")
    monkeypatch.setenv("MPISYNC_TIMEOUT", "none")
    s = resolve(max_concurrent=None, fusion_bytes=None, gpu_transport="STAGED")
    assert (s.max_concurrent.source, s.fusion_bytes.value, s.fusion_bytes.source) == (
        "built-in",
        4096,
        "environment",
    )
    assert (s.gpu_transport.value, s.gpu_transport.source) == ("staged", "argument")
    assert s.timeout.value is None
    assert resolve(fusion_bytes=7).fusion_bytes.value == 7
    monkeypatch.setenv("MPISYNC_MAX_CONCURRENT", "zero")
    with pytest.raises(InvalidParamError, match="MPISYNC_MAX_CONCURRENT"):
        resolve()
    with pytest.raises(InvalidParamError, match="gpu_transport"):
        resolve(max_concurrent=1, gpu_transport="carrier-pigeon")
