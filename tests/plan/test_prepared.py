"""Unit tests of mpisync.plan.prepared.all_smaller on the general and the bulk manifest."""

import numpy as np


def test_all_smaller_than_fusion_bytes_on_both_manifests():
    from mpisync.params.bulk import scan
    from mpisync.params.manifest import build_manifest
    from mpisync.plan.prepared import all_smaller

    for arrays, expected in (
        ({"a": np.zeros(10), "b": np.zeros(127, np.uint8)}, True),
        ({"a": np.zeros(10), "b": np.zeros(128, np.uint8)}, False),
        ({}, False),
    ):
        general = build_manifest(arrays, rank=0, size=2, root=0, settings={})
        assert all_smaller(general, 128) is expected
        bulk = scan(arrays, rank=0, size=2, root=0, devices=None, settings={})
        if bulk is not None:
            assert all_smaller(bulk, 128) is expected
