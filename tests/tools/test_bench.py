"""The bench's own parts: the limit row's work, OSU's method for the raw MPI rows, written
buffers, and tables that explain their columns (plain pass and under MPI at any rank count)."""

import numpy as np
import pytest
from mpi4py import MPI

from mpisync.tools import workloads
from mpisync.tools.bench import compare, limits, osu, output, strategies, suite
from mpisync.tools.bench.buffers import written, written_like

from mpiutil import everyone


@pytest.mark.parametrize(
    "operation, nbytes, ranks, expected",
    [
        ("broadcast", 1200, 1, [(0, 0)]),
        ("broadcast", 1200, 2, [(0, 600), (0, 600)]),
        ("broadcast", 1200, 3, [(0, 800)] * 3),
        ("all-reduce", 1200, 2, [(600, 600)] * 2),
        ("all-reduce", 1200, 3, [(800, 800)] * 3),
        ("all-reduce", 1200, 1, [(0, 0)]),
        ("reduce-scatter", 1200, 3, [(800, 0)] * 3),
        ("all-gather", 1200, 3, [(0, 800)] * 3),
        ("all-gather out of place", 1200, 3, [(0, 1200)] * 3),
        ("all-gather out of place", 1200, 1, [(0, 1200)]),
        ("reduce", 1200, 3, [(800, 800), (800, 0), (800, 0)]),
        ("reduce", 1200, 4, [(900, 900), (900, 0), (900, 0), (900, 0)]),
    ],
)
def test_the_limit_rows_work_per_rank(operation, nbytes, ranks, expected):
    got = [
        (w.add, w.copy)
        for w in (limits.work(operation, nbytes, ranks, rank) for rank in range(ranks))
    ]
    assert got == expected


def test_a_reduce_limit_puts_the_gather_on_the_root():
    assert limits.work("reduce", 1200, 3, rank=2, root=2) == limits.Work(800, 800)
    assert limits.work("reduce", 1200, 3, rank=0, root=2) == limits.Work(800, 0)


def test_the_limit_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="unknown operation 'bcast'; choose from broadcast"):
        limits.work("bcast", 10, 2)
    with pytest.raises(ValueError, match="need ranks >= 1"):
        limits.work("broadcast", 10, 2, rank=2)
    with pytest.raises(ValueError, match="need ranks >= 1"):
        limits.work("broadcast", -1, 2)


def test_a_limit_run_adds_every_peer_slice_once_then_copies():
    share = limits.work("all-reduce", 1200, 3)
    run = limits.LimitRun(share, 3)
    assert run.slice.nbytes * 2 == share.add == run.peers.nbytes
    assert run.target.nbytes == share.copy == run.source.nbytes
    run.peers[:] = np.arange(run.peers.size, dtype=np.float32)
    run()
    half = run.slice.size
    assert np.array_equal(run.slice, run.peers[:half] + run.peers[half:])
    assert run.target.tobytes() == run.source.tobytes() == run.peers.tobytes()[: share.copy]
    nothing = limits.LimitRun(limits.work("broadcast", 1200, 1), 1)
    nothing()  # one rank: nothing to move, and no error
    assert nothing.target.size == 0 and nothing.slice.size == 0


def test_written_buffers_hold_their_value_in_every_element():
    a = written(3 << 20, np.float32, value=0.5)
    assert a.dtype == np.float32 and a.size == 3 << 20 and np.all(a == 0.5)
    b = written_like(a, value=7)
    assert b.shape == a.shape and b.dtype == a.dtype and np.all(b == 7)
    assert written(0).size == 0 and written(-5).size == 0


def test_osu_counts_are_osus_defaults_scaled():
    assert osu.counts(1, 1.0) == (1000, 200) and osu.counts(8192, 1.0) == (1000, 200)
    assert osu.counts(8193, 1.0) == (100, 10) and osu.counts(1 << 20, 0.05) == (5, 1)
    assert osu.counts(4, 0.0001) == (1, 1)
    assert osu.sizes_up_to(64) == [1, 2, 4, 8, 16, 32, 64] and osu.sizes_up_to(64, 4)[0] == 4


def test_the_bench_options_refuse_an_unknown_raw_row(capsys):
    with pytest.raises(SystemExit) as info:
        suite.parser().parse_args(["--osu-ops", "bcast,alltoall"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        assert "--osu-ops: choose from bcast, allreduce, reduce, allgather" in err
    else:  # every rank parses the same arguments: the message once, from rank 0
        assert err == ""
    assert suite.parser().parse_args(["--osu-ops", "reduce"]).osu_ops == "reduce"


def _tables(text: str) -> list:
    """Each table of a report (title, header, rows, legend: the blocks of 3 lines or more after the
    report's heading)."""
    return [b.splitlines() for b in text.split("\n\n")[1:] if len(b.splitlines()) >= 3]


def _report(comm):
    args = suite.parser().parse_args(
        [
            "--quick",
            "--no-progress",
            "--osu-max",
            "64",
            "--osu-scale",
            "0.01",
            "--no-ibcast",
            "--workloads",
            "many-small",
            "--iterations",
            "2",
            "--warmup",
            "0",
            "--sweep-concurrency",
            "4",
            "--sweep-fusion",
            "",
            "--allreduce",
            "grads",
            "--allreduce-iterations",
            "2",
            "--allreduce-sets",
            "many-small",
        ]
    )
    return suite.run(comm, args)


@pytest.mark.mpi
def test_every_table_says_what_its_columns_mean(comm):
    results = _report(comm)
    text = output.table(results)
    assert "ideal" not in text and "gloo DDP" not in text
    assert (
        "Ibcast us" not in text and "overlap_pct" not in results["osu"]["bcast"][0]
    )  # --no-ibcast
    assert "OSU's method (means per call;" in text and "median over 2 iterations" in text
    tables = _tables(text)
    assert len(tables) == 4 + 1 + 1 + 1  # 4 raw MPI rows, the workload, its sweep, grads
    for lines in tables:
        legend = next(line for line in lines[2:] if "docs/performance.md" in line)
        assert any(unit in legend for unit in ("milliseconds", "microseconds")), legend
    workload = results["workloads"][0]
    by_name = {r["strategy"]: r for r in workload["results"]}
    assert by_name["flat Bcast"]["bandwidth_vs_flat"] == 1.0
    assert by_name[suite.LIMIT]["median_s"] > 0
    grads = results["allreduce"]["grads"][0]
    assert grads["limit_ms"] > 0
    if comm.size > 1:
        assert by_name[suite.LIMIT]["of_limit"] == 1.0 and by_name["ParamSync"]["of_limit"] > 0
        assert grads["of_limit"] > 0
    else:  # one rank moves nothing: no limit to be a fraction of
        assert by_name["ParamSync"]["of_limit"] is None and grads["of_limit"] is None
    assert workload["limit_bytes_per_rank"] == workload["bytes"] * (comm.size - 1) // comm.size
    assert [r["bytes"] for r in results["osu"]["allreduce"]] == [4, 8, 16, 32, 64]
    assert results["meta"]["osu_method"] == osu.method()
    for r in workload["results"]:  # every row's spread and samples, the median among them
        assert len(r["samples_s"]) == 2 and r["min_s"] <= r["median_s"] <= r["max_s"]
        assert sorted(r["samples_s"]) == [r["min_s"], r["max_s"]]
    assert set(grads["samples_s"]) >= {"GradSync", "limit"}
    env = results["meta"]["environment"]
    assert env["nodes"] == 1 and sum(env["ranks_per_node"].values()) == comm.size
    assert env["versions"]["numpy"] == np.__version__ and env["cpu"]
    assert "  " not in results["meta"]["mpi_library"] and "MPISYNC_LOG" in env["settings"]
    assert "min-max ms" in text


@pytest.mark.mpi
@pytest.mark.parametrize("operation", limits.OPERATIONS)
def test_the_limit_row_runs_and_times_the_slowest_rank(comm, operation):
    timing = limits.measure_limit(comm, operation, 1 << 20, iterations=3, warmup=1)
    assert len(timing.samples) == 3 and all(t > 0 for t in timing.samples)
    assert comm.allgather(timing.samples) == [timing.samples] * comm.size


@pytest.mark.mpi
def test_interleaved_runs_rewrite_their_inputs_untimed_in_one_order_on_every_rank(comm):
    """``before(name)`` precedes each run of ``name`` (warm-up too) and is not in its time; the
    shuffled order is the same on every rank."""
    import time

    from mpisync.tools.bench.timing import measure_interleaved

    events: list = []
    runs = {name: (lambda name=name: events.append(("run", name))) for name in "abc"}

    def before(name):
        events.append(("before", name))
        time.sleep(0.2 if name == "b" else 0)

    timings = measure_interleaved(comm, runs, iterations=4, warmup=1, before=before)
    assert events[0::2] == [("before", name) for _, name in events[1::2]]
    ran = [name for _, name in events[1::2]]
    assert sorted(ran) == sorted("abc" * 5) and ran[:3] == list("abc")
    assert comm.allgather(ran) == [ran] * comm.size
    assert max(timings["b"].samples) < 0.2


def _check_rows(comm, rows, sizes):
    assert [r["bytes"] for r in rows] == sizes
    for r in rows:
        assert r["iterations"] == (20 if r["bytes"] <= 8192 else 2)  # 1000 / 100 at scale 0.02
        assert 0 <= r["lat_min_us"] <= r["lat_avg_us"] <= r["lat_max_us"], r
    assert comm.allgather(rows) == [rows] * comm.size


@pytest.mark.mpi
@pytest.mark.parametrize("operation", list(osu.OPERATIONS))
def test_raw_rows_follow_osus_loop(comm, operation, monkeypatch):
    sizes = [1, 2, 4, 16384]
    expected = [s for s in sizes if s >= osu.OPERATIONS[operation][2]]
    rows = osu.sweep(comm, operation, sizes, scale=0.02)
    _check_rows(comm, rows, expected)
    monkeypatch.setattr(osu, "_osuloop", None)  # the Python loop, its call cost subtracted
    assert osu.method() == "Python loop, call cost subtracted"
    rows = osu.sweep(comm, operation, sizes[-1:], scale=0.02)
    _check_rows(comm, rows, [16384])


@pytest.mark.mpi
def test_the_c_loop_refuses_a_buffer_shorter_than_its_count(comm):
    if not everyone(comm, osu._osuloop is not None):
        pytest.skip("the C loop is not built here")
    short = written(8, np.float32)
    with pytest.raises(ValueError, match="a buffer is shorter than the count needs"):
        osu._osuloop.osu_loop(1, comm.handle, short, short, 9, 0, 1, 1)
    with pytest.raises(ValueError, match="bad operation"):
        osu._osuloop.osu_loop(7, comm.handle, short, short, 1, 0, 1, 1)
    gathered = written(4 * comm.size - 1)
    with pytest.raises(ValueError, match="shorter"):
        osu._osuloop.osu_loop(3, comm.handle, written(4), gathered, 4, 0, 1, 1)
    comm.Barrier()  # nothing was left half-called: the next collective meets on every rank


@pytest.mark.mpi
def test_bcast_rows_carry_ibcast_and_overlap(comm):
    rows = osu.bcast_sweep(comm, [8, 32], scale=0.01)
    assert [r["bytes"] for r in rows] == [8, 32]
    assert all(r["ibcast_avg_us"] >= 0 and 0 <= r["overlap_pct"] <= 100 for r in rows)


@pytest.mark.mpi
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_the_first_sync_on_new_memory_syncs_copies(comm, library):
    """The row's syncs land in copies of the set (root's bytes on every rank; the shared set keeps
    this rank's own), and closing it lets the copies go."""
    if library == "torch":
        pytest.importorskip("torch")  # installed or not: the same on every rank
    shapes = {"large": ((4 << 20) // 4,), "small": (100,)}
    params = workloads.make_params(
        {k: (shape, np.float32) for k, shape in shapes.items()}, comm.rank, library
    )
    mine = {k: np.asarray(v).tobytes() for k, v in params.items()}
    roots = {
        k: np.asarray(v).tobytes()
        for k, v in workloads.make_params(
            {k: (shape, np.float32) for k, shape in shapes.items()}, 0, library
        ).items()
    }
    run, close = strategies.paramsync_first_new_memory(comm, params, 0)
    for _ in range(3):
        run()
    assert {k: np.asarray(v).tobytes() for k, v in run.params.items()} == roots
    assert {k: np.asarray(v).tobytes() for k, v in params.items()} == mine
    close()
    assert run.params == {}


def _doc(median: float, low: float, high: float, quick: bool = False) -> dict:
    row = {"strategy": "ParamSync", "median_s": median, "min_s": low, "max_s": high}
    osu_row = {"bytes": 8, "lat_avg_us": 2.0, "lat_min_us": 1.0, "lat_max_us": 3.0}
    return {
        "meta": {"ranks": 2, "mpi_library": "MPICH", "quick": quick},
        "osu": {"bcast": [osu_row]},
        "workloads": [{"workload": "resnet50", "results": [row]}],
        "sweeps": [],
        "allreduce": {
            "check": [{"bytes": 8, "checked_us": 10.0, "samples_s": {"checked": [9e-6, 1.2e-5]}}]
        },
    }


def test_compare_gives_each_rows_ratio_and_calls_a_difference_only_beyond_the_spread():
    a = _doc(0.010, 0.009, 0.011)
    faster, overlapping = _doc(0.005, 0.004, 0.006), _doc(0.0105, 0.0100, 0.0120, quick=True)
    lines = compare.compare(a, faster).splitlines()
    row = next(line for line in lines if line.startswith("resnet50: ParamSync"))
    assert row.split()[-3:] == ["0.500", "B", "faster"]
    assert "9.0000-11.0000" in row and "4.0000-6.0000" in row
    osu_row = next(line for line in lines if line.startswith("osu bcast 8 B"))
    assert osu_row.endswith("1.000  within spread")
    check = next(line for line in lines if line.startswith("allreduce check bytes=8 checked"))
    assert "0.0090-0.0120" in check
    text = compare.compare(a, overlapping)
    assert "1.050  within spread" in text and "B is a --quick smoke test" in text


@pytest.mark.launcher  # the installed command, run in the plain pass
def test_the_bench_compares_two_files_without_mpi(installed, bounded_env, tmp_path):
    import json

    paths = []
    for name, doc in (("a", _doc(0.010, 0.009, 0.011)), ("b", _doc(0.020, 0.019, 0.021))):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    proc = installed.run(["bench", "--compare", *map(str, paths)], bounded_env)
    assert proc.returncode == 0, proc.stderr
    assert any(
        line.startswith("resnet50: ParamSync") and line.endswith("2.000  B slower")
        for line in proc.stdout.splitlines()
    ), proc.stdout
    bad = installed.run(["bench", "--compare", str(paths[0]), str(tmp_path / "none")], bounded_env)
    assert bad.returncode == 2 and "FileNotFoundError" in bad.stderr


def test_a_raw_row_far_above_both_neighbours_is_flagged():
    rows = [{"lat_avg_us": v} for v in (1.1, 52.0, 5.0, 19.0, 525.0, 19.0)]
    assert output.osu_outliers(rows) == {1, 4}
