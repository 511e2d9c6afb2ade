"""The feature checks that keep the backend on torch's older and newer releases
(docs/compatibility.md), each with its fallback: run on whichever torch the venv has."""

import gc
import importlib
import types

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from mpisync.torch import backend, compat, mixed, module_states, work  # noqa: E402
from mpisync.torch.process_group import ProcessGroupMPISync  # noqa: E402


def test_this_torch_has_what_the_backend_needs():
    assert compat.missing() == []
    compat.require()


def test_a_torch_without_the_backend_interface_is_refused_naming_the_supported_range():
    bare = types.SimpleNamespace(Backend=types.SimpleNamespace(register_backend=lambda name: 0))
    lacks = compat.missing(bare)
    assert len(lacks) == 3
    with pytest.raises(ImportError, match=f"supports torch {compat.OLDEST} to {compat.NEWEST}"):
        compat.require(bare)


def test_registration_is_seen_with_or_without_torchs_table_of_plugins():
    assert backend._registered(dist.Backend)
    assert backend._registered(types.SimpleNamespace(_plugins={"MPISYNC": object()}))
    assert not backend._registered(types.SimpleNamespace(_plugins={}))
    assert backend._registered(types.SimpleNamespace(backend_list=["gloo", "mpisync"]))
    assert not backend._registered(types.SimpleNamespace(backend_list=["gloo"]))


def test_the_module_state_sync_is_replaced_only_where_torch_has_its_names():
    import torch.distributed.utils as utils
    import torch.nn.parallel.distributed as ddp

    assert module_states.replaceable(utils, ddp)
    assert ddp._sync_module_states is module_states._sync_module_states  # installed here
    assert not module_states.replaceable(types.SimpleNamespace(), ddp)


def test_backend_options_get_the_fields_they_have():
    full = types.SimpleNamespace(global_ranks_in_group=None, group_name=None)
    mixed._describe(full, [0, 2], "7")
    assert (full.global_ranks_in_group, full.group_name) == ([0, 2], "7")
    bare = types.SimpleNamespace()
    mixed._describe(bare, [0, 2], "7")  # 2.5's gloo options: neither field
    assert vars(bare) == {}


def test_a_work_over_a_future_without_torchs_maker():
    done = torch.futures.Future()
    made = work.from_future(done, None)
    assert isinstance(made, work.FutureWork) and id(made) in work._held
    assert not made.is_completed()
    done.set_result([torch.ones(2)])
    assert made.wait() and made.is_completed() and id(made) not in work._held
    assert made.get_future() is done
    assert [t.tolist() for t in made.result()] == [[1.0, 1.0]]
    failed = torch.futures.Future()
    failed.set_exception(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        work.from_future(failed, None).wait()


def test_a_work_over_a_future_with_torchs_maker():
    maker = work.torch_maker()
    if maker is None:
        pytest.skip("this torch has no _create_work_from_future")
    done = torch.futures.Future()
    done.set_result([torch.zeros(1)])
    made = work.from_future(done, maker)
    assert not isinstance(made, work.FutureWork)
    assert made.wait() and made.get_future().value()[0].tolist() == [0.0]


def test_held_works_past_the_cap_let_the_older_finished_ones_go(monkeypatch):
    monkeypatch.setattr(work, "_HELD_MAX", 4)
    monkeypatch.setattr(work, "_held", {})
    finished = [types.SimpleNamespace(_finished=lambda: True) for _ in range(2)]
    pending = types.SimpleNamespace(_finished=lambda: False)
    for item in [pending, *finished]:
        work.hold(item)
    late = [types.SimpleNamespace(_finished=lambda: True) for _ in range(2)]
    for item in late:
        work.hold(item)  # the fifth: the older half (pending, finished[0]) is swept
    assert list(work._held.values()) == [pending, finished[1], *late]


@pytest.fixture
def group():
    made = ProcessGroupMPISync(MPI.COMM_SELF, timeout=30)
    yield made
    made.shutdown()


def test_a_work_handed_to_torchs_cpp_keeps_its_python_methods_until_waited(group):
    """torch's C++ holds only the C++ part of a Python work: once the Python object is gone it
    calls the base class (whose wait never returns, on torch 2.5). The work is held until
    waited for, so C++ finds the Python object: boxed and unboxed, it is still mpisync's."""
    if not hasattr(dist._Work, "boxed"):
        pytest.skip("this torch cannot box a work")
    t = torch.arange(3.0)
    boxed = group.allreduce([t]).boxed()
    gc.collect()
    unboxed = dist._Work.unbox(boxed)
    assert type(unboxed) is work.Work
    key = id(unboxed)
    assert key in work._held
    assert unboxed.wait() and key not in work._held
    assert t.tolist() == [0.0, 1.0, 2.0]


def test_torchs_group_name_accessors_keep_the_name(group):
    group._set_group_name("7")
    group._set_group_desc("the seventh")
    assert (group.group_name, group.getGroupName()) == ("7", "7")
    assert (group.group_desc, group.getGroupDesc()) == ("the seventh", "the seventh")


def test_the_names_are_kept_where_torch_has_no_setter_of_its_own(group, monkeypatch):
    monkeypatch.delattr(dist.ProcessGroup, "_set_group_name")
    group._set_group_name("8")
    assert group.group_name == "8"


def test_env_rendezvous_is_extended_only_where_torch_has_its_table(monkeypatch):
    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # not the function
    table = {"env": lambda url, **kwargs: iter(())}
    monkeypatch.setattr(rendezvous, "_rendezvous_handlers", table)
    backend._extend_env_rendezvous()
    wrapped = table["env"]
    assert getattr(wrapped, "mpisync", False)
    backend._extend_env_rendezvous()
    assert table["env"] is wrapped  # once only
    monkeypatch.delattr(rendezvous, "_rendezvous_handlers")
    backend._extend_env_rendezvous()  # nothing to extend: env:// as on any backend
