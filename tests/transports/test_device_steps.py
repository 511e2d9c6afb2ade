"""Unit tests of the device steps compiled from the device columns (no MPI): every device master's
bytes carried once (the pieces of a name add up to its size), and each name's replicas filled by
the step that completes it (the last holding its bytes), never before."""

import numpy as np
import pytest

from mpisync.devices.simulated import SimulatedDeviceArray as Dev


def _params():
    return {
        "big": [Dev(np.arange(2500, dtype=np.float32), 0), Dev(np.zeros(2500, np.float32), 1)],
        "empty": [Dev(np.zeros(0, np.float32), 0), Dev(np.zeros(0, np.float32), 1)],
        "host": np.zeros(5),
        **{
            f"t{i}": [Dev(np.full(i + 1, i, np.int16), i % 2) for _ in range(1 + i % 3)]
            for i in range(9)
        },
    }


@pytest.mark.parametrize("fusion,chunk", [(0, 1 << 20), (16, 1000), (64, 4096), (1 << 20, 1 << 20)])
def test_device_steps_cover_every_byte_once_and_fan_out_when_complete(fusion, chunk):
    from mpisync.params.manifest import build_manifest
    from mpisync.plan.transfers import bulk_plan
    from mpisync.transports.device_pipeline import compile_device_steps

    manifest = build_manifest(_params(), rank=0, size=2, root=0)
    assert not manifest.errors
    columns = manifest.device_columns
    assert columns.names == [p.name for p in manifest.device_params] and "host" not in columns.names
    steps = compile_device_steps(columns, bulk_plan(columns.sizes, fusion, chunk))
    backend = columns.masters[0].backend
    covered: dict = {}
    last_step: dict = {}
    for index, step in enumerate(steps):
        assert step.nbytes == sum(backend.length(v) for v in step.views)
        assert step.nbytes <= max(fusion, chunk)
        for name, view in zip(step.label, step.views):
            covered[name] = covered.get(name, 0) + backend.length(view)
            last_step[name] = index
    sizes = dict(zip(columns.names, columns.sizes.tolist()))
    assert covered == {name: n for name, n in sizes.items() if n}
    filled = [(index, dst) for index, step in enumerate(steps) for dst, _ in step.fan_out]
    for i, name in enumerate(columns.names):
        others = columns.replicas.get(i, [columns.masters[i]])[1:]
        assert len(others) == len(_params()[name]) - 1, name
        mine = [index for index, dst in filled if any(dst is r.data for r in others)]
        if sizes[name]:
            assert mine == [last_step[name]] * len(others), name
            step = steps[last_step[name]]
            devices = {columns.masters[i].device, *(r.device for r in others)}
            assert devices <= set(step.devices), name
