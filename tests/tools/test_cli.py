"""The mpisync command, installed as a user installs it and run from outside the repo."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cliutil import ONE_SMALL_ITERATION, STALE

pytestmark = pytest.mark.launcher
REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
TINY_BENCH = [
    "bench",
    "--quick",
    "--no-osu",
    "--no-sweep",
    "--workloads",
    "resnet50",
    "--iterations",
    "2",
    "--warmup",
    "0",
]


def test_install_is_fresh_typed_and_licensed(installed, bounded_env):
    package = installed.site / "mpisync"
    assert (package / "py.typed").exists()
    assert not (package / STALE).exists()  # the planted build/ folder was not reused
    assert not list(package.glob("_speedups*"))  # no compiler: left out, not taken from build/
    licenses = list(installed.site.glob("mpisync-*.dist-info/**/LICENSE"))
    assert licenses and "MIT License" in licenses[0].read_text()
    where = subprocess.run(
        [sys.executable, "-c", "import mpisync; print(mpisync.__file__)"],
        cwd=installed.home,
        env=installed.env(bounded_env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.strip() == str(package / "__init__.py"), where.stdout + where.stderr
    info = json.loads(installed.run(["info", "--json"], bounded_env).stdout)
    assert info["speedups"].startswith("not built")


def test_version(installed, bounded_env):
    proc = installed.run(["--version"], bounded_env)
    assert proc.returncode == 0 and proc.stdout == "mpisync 0.1.0\n", proc.stdout + proc.stderr


@pytest.mark.parametrize("missing", ["libmpi", "mpi4py"])
def test_without_mpi_version_help_and_info_say_what_to_install(
    installed, bounded_env, tmp_path, missing
):
    """No MPI library (or no mpi4py): the diagnostic commands run, and say in one line what to
    install; a command that needs MPI ends with that line, not a traceback."""
    env = dict(bounded_env, MPI4PY_LIBMPI=str(tmp_path / "libmpi.so.12"))
    without: tuple = ()
    if missing == "mpi4py":
        env, without = bounded_env, ("mpi4py",)
    why = "mpi4py hidden by a test" if without else str(tmp_path / "libmpi.so.12")

    version = installed.run(["--version"], env, without=without)
    assert (version.returncode, version.stdout, version.stderr) == (0, "mpisync 0.1.0\n", "")
    module = subprocess.run(
        [sys.executable, "-m", "mpisync", "--version"],
        env=installed.env(env, without=without),
        cwd=installed.home,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (module.returncode, module.stdout, module.stderr) == (0, "mpisync 0.1.0\n", "")
    usage = installed.run(["--help"], env, without=without)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: mpisync"), usage.stderr
    assert usage.stderr == ""

    info = installed.run(["info"], env, without=without)
    assert info.returncode == 1 and info.stderr == "", info.stderr
    rows = dict(line.split(" : ", 1) for line in info.stdout.splitlines() if " : " in line)
    rows = {key.strip(): value for key, value in rows.items()}
    assert rows["mpisync"] == "0.1.0" and rows["numpy"] != "not installed", info.stdout
    line = rows["mpi_library"]
    assert line.startswith("none: mpisync needs ") and why in line, line
    assert 'install one: pip install "mpisync[mpich]"' in line, line
    assert "  timeout         = 300.0" in info.stdout  # the settings still shown
    as_json = installed.run(["info", "--json"], env, without=without)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["mpi_library"] == line

    bench = installed.run(["bench", "--quick"], env, without=without)
    assert bench.returncode == 1 and bench.stdout == "", bench.stdout
    assert bench.stderr.startswith("mpisync bench: error: mpisync needs ") and why in bench.stderr
    assert bench.stderr.count("\n") == 1, bench.stderr


def test_info_shows_a_bad_setting_on_its_line_and_goes_on(installed, bounded_env):
    env = dict(
        bounded_env, MPISYNC_TIMEOUT="5m", MPISYNC_FUSION_BYTES="256K", MPISYNC_MAX_CONCURRENT="8"
    )
    proc = installed.run(["info"], env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        "  timeout         = INVALID    (MPISYNC_TIMEOUT='5m': timeout must be a number of "
        "seconds, got '5m'; "
        "every sync raises until it is fixed or unset)"
    ) in lines
    assert (
        "  fusion_bytes    = INVALID    (MPISYNC_FUSION_BYTES='256K': fusion_bytes must be an "
        "integer, "
        "got '256K'; every sync raises until it is fixed or unset)"
    ) in lines
    assert "  max_concurrent  = 8          (environment; set with MPISYNC_MAX_CONCURRENT)" in lines
    keys = [line.split(" ", 1)[0] for line in lines]
    assert (
        keys.index("defaults:")
        < keys.index("speedups")
        < keys.index("host_transport")
        == len(lines) - 1
    )  # went on to the end
    info = json.loads(installed.run(["info", "--json"], env).stdout)
    assert info["defaults"]["timeout"] == {
        "value": None,
        "source": "environment",
        "env": "MPISYNC_TIMEOUT",
        "raw": "5m",
        "error": "MPISYNC_TIMEOUT: timeout must be a number of seconds, got '5m'",
    }


def test_info_reports_bad_switches_unknown_names_and_the_launch(installed, bounded_env):
    env = dict(
        bounded_env,
        MPISYNC_CROSS_MEMORY="ture",
        MPISYNC_LOG="dbug",
        MPISYNC_TIMOUT="5",
        SLURM_STEP_ID="0",
        SLURM_STEP_NUM_TASKS="2",
    )
    proc = installed.run(["info"], env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        "setting_errors   : MPISYNC_CROSS_MEMORY: an on/off switch takes 1, 0, true, false, yes, "
        "no, on or off (any case), got 'ture'; every sync raises until it is fixed or unset; "
        "MPISYNC_LOG: a log level takes debug, info, warning, error, critical (any case), got "
        "'dbug'; every sync raises until it is fixed or unset"
    ) in lines
    assert "unknown_settings : MPISYNC_TIMOUT (ignored; did you mean MPISYNC_TIMEOUT?)" in lines
    launch = next(line for line in lines if line.startswith("launch "))
    assert (
        launch.startswith(
            "launch           : MISMATCH, every sync raises: this process is alone in its MPI world"
        )
        and "srun without an MPI plugin started it as one of 2 processes" in launch
    )
    info = json.loads(installed.run(["info", "--json"], bounded_env).stdout)
    assert info["setting_errors"] == [] and info["unknown_settings"] == []
    assert info["launch"] == "ok: one process, no launcher that started more"


def test_info_lists_every_setting_with_its_value_and_source(installed, bounded_env):
    """Every setting mpisync reads has a line, the environment's value and source where set,
    the built-in default where not, and an invalid switch said so on its own line."""
    from mpisync.config import PATHS, SWITCHES

    env = dict(
        bounded_env,
        MPISYNC_LOG="info",
        MPISYNC_TORCH_CHECK="0",
        MPISYNC_SPEEDUPS="maybe",
        MPISYNC_TIMELINE="/tmp/trace",
    )
    proc = installed.run(["info"], env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert "  MPISYNC_LOG               = info       (environment)" in lines
    assert "  MPISYNC_TORCH_CHECK       = False      (environment)" in lines
    assert "  MPISYNC_TIMELINE          = /tmp/trace (environment)" in lines
    assert "  MPISYNC_FAIL_FAST         = True       (built-in)" in lines
    assert (
        "  MPISYNC_SPEEDUPS          = True       (environment; 'maybe' is not a switch)" in lines
    )
    info = json.loads(installed.run(["info", "--json"], env).stdout)
    assert set(info["settings"]) == {*SWITCHES, "MPISYNC_LOG", *PATHS}
    assert info["settings"]["MPISYNC_TUNING"] == {"value": None, "source": "built-in"}


def test_info_prints_once_under_mpiexec(installed, bounded_env):
    proc = installed.run(["info"], bounded_env, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("defaults:") == 1 and proc.stdout.count("mpi_library") == 1, (
        proc.stdout
    )
    assert "world_size       : 2" in proc.stdout


@pytest.mark.parametrize("launch", ["no launcher", "mpiexec -n 1"])
def test_bench_at_one_rank_ends_and_says_what_it_measures(installed, bounded_env, launch):
    # Without a launcher, also without tqdm: the progress is plain text, with its total.
    start = time.monotonic()
    bare = launch == "no launcher"
    proc = installed.run(
        TINY_BENCH + ([] if bare else ["--no-progress"]),
        bounded_env,
        ranks=0 if bare else 1,
        without=("tqdm",) if bare else (),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "mpisync bench: 1 rank (no launcher, or mpiexec -n 1): no peer to broadcast to"
        in proc.stderr
    )
    assert "mpisync bench: 1 rank, root 0" in proc.stdout
    assert "1 rank: no peer to broadcast to, so these times are mpisync's own cost" in proc.stdout
    assert "resnet50: 320 tensors" in proc.stdout and "ParamSync " in proc.stdout
    assert time.monotonic() - start < 200
    steps = [
        line
        for line in proc.stderr.splitlines()
        if line.startswith("mpisync bench: ") and "steps" in line
    ]
    if bare:
        assert steps and steps[-1] == "mpisync bench: 3/3 steps (100%) resnet50: memory", (
            proc.stderr
        )
        assert all("/3 steps" in line for line in steps)
    else:
        assert not steps


def test_bench_plot_without_matplotlib_is_refused_before_any_work(installed, bounded_env, tmp_path):
    start = time.monotonic()
    proc = installed.run(
        TINY_BENCH + ["--plot", tmp_path / "b.png"], bounded_env, ranks=2, without=("matplotlib",)
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        proc.stderr.count(
            "mpisync bench: error: --plot needs matplotlib: pip install 'mpisync[plot]'"
        )
        == 1
    )
    assert proc.stdout == "" and not (tmp_path / "b.png").exists()
    assert time.monotonic() - start < 60
    blocked = installed.run(TINY_BENCH + ["--json", "/proc/mpisync-test/b.json"], bounded_env)
    assert blocked.returncode == 2 and blocked.stdout == "", blocked.stdout + blocked.stderr
    assert blocked.stderr.startswith(
        "mpisync bench: error: --json /proc/mpisync-test/b.json: cannot create its folder "
        "/proc/mpisync-test:"
    )
    for scale in ("-1", "0", "nan"):
        refused = installed.run(TINY_BENCH + ["--osu-scale", scale], bounded_env)
        assert refused.returncode == 2 and refused.stderr == (
            f"mpisync bench: error: --osu-scale must be > 0, got {float(scale)}\n"
        ), refused.stderr
    setting = installed.run(TINY_BENCH, dict(bounded_env, MPISYNC_TIMEOUT="5m"))
    assert (
        setting.returncode == 2
        and "error: MPISYNC_TIMEOUT: timeout must be a number" in setting.stderr
    )
    unknown = installed.run(["bench", "--workloads", "resnet5O"], bounded_env)
    assert (
        unknown.returncode == 2
        and "unknown workload(s) resnet5O; choose from resnet50" in unknown.stderr
    )


def test_bench_refused_on_one_rank_is_refused_on_every_rank(installed, bounded_env, tmp_path):
    # Rank 1 alone lacks matplotlib (as a node with another image would): both ranks exit 2 at
    # once, with one message naming rank 1, instead of rank 0 starting the bench and waiting.
    args = [str(installed.script), *map(str, TINY_BENCH), "--plot", str(tmp_path / "b.png")]
    ok, hidden = installed.env(bounded_env), installed.env(bounded_env, without=("matplotlib",))
    env = dict(ok, MPIEXEC_TIMEOUT="100")
    cmd = [
        "mpiexec",
        "-n",
        "1",
        "-env",
        "PYTHONPATH",
        ok["PYTHONPATH"],
        *args,
        ":",
        "-n",
        "1",
        "-env",
        "PYTHONPATH",
        hidden["PYTHONPATH"],
        *args,
    ]
    start = time.monotonic()
    proc = subprocess.run(
        cmd, env=env, cwd=installed.home, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("error: --plot needs matplotlib") == 1 and "(on rank 1)" in proc.stderr
    assert proc.stdout == "" and time.monotonic() - start < 60


def _bench_at_two_ranks(installed, bounded_env, args: list) -> subprocess.CompletedProcess:
    """``mpisync bench ARGS`` under ``mpiexec -n 2``, which succeeded."""
    proc = installed.run(["bench", *args], bounded_env, ranks=2, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_bench_quick_at_two_ranks_writes_every_output(installed, bounded_env, tmp_path):
    # Into folders that do not exist yet: created, as by every tool that writes a file. Progress,
    # with tqdm installed, on a stderr that is not a terminal: plain lines, no carriage returns.
    out = tmp_path / "new" / "folder" / "bench"
    proc = _bench_at_two_ranks(
        installed,
        bounded_env,
        [
            "--quick",
            "--osu-max",
            "4096",
            "--json",
            f"{out}.json",
            "--csv",
            f"{out}.csv",
            "--plot",
            f"{out}.png",
        ],
    )
    assert "mpisync bench: 2 ranks" in proc.stdout and "resnet50: 320 tensors" in proc.stdout
    assert "many-small: 5000 tensors" in proc.stdout
    results = json.loads(out.with_suffix(".json").read_text())
    assert (
        results["meta"]["ranks"] == 2 and [r["bytes"] for r in results["osu"]["bcast"]][-1] == 4096
    )
    assert list(results["osu"]) == ["bcast", "allreduce", "reduce", "allgather"]
    # installed without a compiler: the raw rows' loop runs in Python, and the tables say so
    assert results["meta"]["osu_method"] == "Python loop, call cost subtracted"
    assert proc.stdout.count("timed loop: Python loop, call cost subtracted") == 4
    for w in results["workloads"]:
        by_name = {r["strategy"]: r for r in w["results"]}
        assert (
            by_name["flat Bcast"]["bandwidth_vs_flat"] == 1.0
            and by_name["ParamSync"]["median_s"] > 0
        )
        assert by_name["limit (local copies)"]["of_limit"] == 1.0
        assert by_name["ParamSync"]["of_limit"] > 0 and w["limit_bytes_per_rank"] == w["bytes"] // 2
        assert w["memory"]["extra_bytes_repeated"] <= w["memory"]["bound_bytes"] + (1 << 20)
    assert {(s["workload"], s["param"]) for s in results["sweeps"]} >= {
        ("resnet50", "fusion_bytes"),
        ("many-small", "max_concurrent"),
    }
    assert (
        out.with_suffix(".csv")
        .read_text()
        .startswith("section,workload,name,value,seconds,gbps,vs_flat,vs_per_tensor,of_limit\n")
    )
    assert "ideal" not in proc.stdout and "gloo DDP" not in proc.stdout
    assert out.with_suffix(".png").read_bytes()[:8] == PNG
    # 13 + 11 + 11 + 13 raw rows (Bcast and Allgather from 1 B, Allreduce and Reduce from 4 B, to
    # 4 KiB), then 2 workloads of 5 timed iterations and a memory row each
    steps = [line for line in proc.stderr.splitlines() if line.startswith("mpisync bench: ")]
    assert "\r" not in proc.stderr and steps[0].startswith("mpisync bench: 1/60 steps (1%) osu")
    assert steps[-1] == "mpisync bench: 60/60 steps (100%) many-small: memory", proc.stderr


def test_bench_help_is_printed_once_under_mpiexec(installed, bounded_env):
    proc = installed.run(["bench", "--help"], bounded_env, ranks=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("usage: mpisync bench") == 1 and proc.stderr == "", proc.stdout
    assert "docs/performance.md" in proc.stdout and "--osu-ops" in proc.stdout


def test_bench_allreduce_rows_beside_gloo_and_flat_allreduce(installed, bounded_env, tmp_path):
    # After a broadcast workload, whose gloo strategy made torch's default group: the all-reduce
    # rows take that group for gloo and add the mpisync group beside it.
    pytest.importorskip("torch")
    out = tmp_path / "ar"
    proc = _bench_at_two_ranks(
        installed,
        bounded_env,
        [
            "--no-osu",
            "--no-sweep",
            "--no-progress",
            *ONE_SMALL_ITERATION,
            "--allreduce",
            "--allreduce-max",
            "64",
            "--allreduce-iterations",
            "2",
            "--allreduce-sets",
            "many-small",
            "--json",
            f"{out}.json",
            "--csv",
            f"{out}.csv",
        ],
    )
    assert "all-reduce bench, 2 ranks" in proc.stdout and "one DDP training step" in proc.stdout, (
        proc.stdout
    )
    reduced = json.loads((tmp_path / "ar.json").read_text())["allreduce"]
    assert [r["bytes"] for r in reduced["sweep"]] == [4, 16, 64]
    assert all(
        r["mpisync_us"] > 0 and r["gloo_us"] > 0 and r["mpi Allreduce_us"] > 0
        for r in reduced["sweep"]
    )
    assert all(r["limit_us"] > 0 and r["of_limit"] > 0 for r in reduced["sweep"])
    (grads,) = reduced["grads"]
    assert (grads["workload"], grads["tensors"], grads["bytes"]) == (
        "many-small",
        5000,
        2_000_000,
    ), grads
    assert grads["vs_flat"] > 0 and grads["vs_per_tensor"] > 0
    assert (
        grads["one_shot_vs_flat"] > 0
        and grads["one_shot_vs_per_tensor"] > 0
        and grads["allreduce, one-shot_ms"] > 0
    )
    assert grads["channel"] == "mpi", grads  # 5000 x 400 B: fused buckets, through MPI
    assert (
        reduced["ddp"]["gloo_ms"] > 0
        and reduced["ddp"]["mpisync_ms"] > 0
        and reduced["ddp"]["DDP, no-op hook_ms"] > 0
    )
    assert 0 < reduced["ddp"]["compute_fraction_free_communication"]
    sections = [line.split(",")[0] for line in (tmp_path / "ar.csv").read_text().splitlines()[1:]]
    assert sections.count("allreduce sweep") == 9 and sections.count("allreduce grads") == 2
    assert sections.count("allreduce ddp") == 4


def _timeline_job(installed, bounded_env, tmp_path, *command) -> tuple:
    """A 2-rank job of ``command`` with a timeline per rank: the finished job and the files."""
    env = dict(bounded_env, MPISYNC_TIMELINE=str(tmp_path / "tl-{rank}.json"))
    job = subprocess.run(
        ["mpiexec", "-n", "2", sys.executable, *command],
        env=installed.env(env),
        cwd=installed.home,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    return job, [tmp_path / "tl-0.json", tmp_path / "tl-1.json"]


def test_timeline_of_a_job_renders_every_span(installed, bounded_env, tmp_path):
    job, files = _timeline_job(
        installed, bounded_env, tmp_path, REPO / "examples" / "sync_demo.py", "--steps", "8"
    )
    events = [e for f in files for e in json.loads(f.read_text())["traceEvents"] if e["ph"] == "X"]
    names = {e["name"] for e in events}
    assert {"validate", "broadcast", "verify"} <= names or {"validate", "cross-memory"} <= names, (
        names
    )
    png = tmp_path / "plots" / "tl.png"  # its folder is created
    proc = installed.run(["timeline", *files, "--out", png], bounded_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"mpisync timeline: {len(events)} spans from 2 files -> {png}\n"
    assert png.read_bytes()[:8] == PNG
    zoom = installed.run(
        ["timeline", files[0], "--out", tmp_path / "one.png", "--sync", "8"], bounded_env
    )
    assert zoom.returncode == 0 and " from 1 file -> " in zoom.stdout, zoom.stderr
    hidden = installed.run(
        ["timeline", *files, "--out", tmp_path / "x.png"], bounded_env, without=("matplotlib",)
    )
    assert (
        hidden.returncode == 2
        and "drawing needs matplotlib: pip install 'mpisync[plot]'" in hidden.stderr
    )
    assert "chrome://tracing" in hidden.stderr and not (tmp_path / "x.png").exists()


_EVERY_OPERATION = """
import sys
import numpy as np
from mpi4py import MPI
import mpisync
from mpisync.tools.stage_checkpoint import stage_checkpoint

comm = MPI.COMM_WORLD
grads = {"w": np.ones(5000, np.float32), "b": np.ones(10, np.float32), "frozen": None}
with mpisync.GradSync(comm, op="avg") as reducer:
    for step in range(20):
        reducer.allreduce(grads)
mpisync.sync_params({"p": np.full(4, float(comm.rank))}, comm)
stage_checkpoint(sys.argv[1], sys.argv[2] + "-{rank}", comm, per_rank=True)
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    import torch.distributed as dist
    import mpisync.torch

    mpisync.torch.init_process_group()
    t = torch.ones(8)
    for _ in range(5):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.destroy_process_group()
print("rank", comm.rank, "torch", torch is not None, flush=True)
"""


def test_timeline_records_every_operation(installed, bounded_env, tmp_path):
    """Broadcasts, one span per all-reduce call, one per torch backend operation, one per
    checkpoint staging: a 20-step GradSync run leaves 20 allreduce spans on each rank."""
    source = tmp_path / "ckpt.bin"
    source.write_bytes(bytes(range(256)) * 64)
    script = tmp_path / "job.py"
    script.write_text(_EVERY_OPERATION)
    job, files = _timeline_job(
        installed, bounded_env, tmp_path, script, source, tmp_path / "staged"
    )
    with_torch = "torch True" in job.stdout
    for rank, path in enumerate(files):
        events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
        count = {
            name: sum(e["name"] == name for e in events) for name in {e["name"] for e in events}
        }
        assert count["allreduce"] == 20 and count["stage-checkpoint"] == 1, count
        assert count["validate"] >= 1, count  # the sync_params broadcast
        allreduce = [e for e in events if e["name"] == "allreduce"]
        assert {e["args"]["tensors"] for e in allreduce} == {2}  # "frozen" skipped
        assert all(e["args"]["bytes"] == 5010 * 4 and e["pid"] == rank for e in allreduce)
        if with_torch:
            assert count["torch all_reduce"] == 5 and count["torch broadcast"] == 1, count
    png = tmp_path / "tl.png"
    proc = installed.run(["timeline", *files, "--out", png], bounded_env)
    assert proc.returncode == 0 and png.read_bytes()[:8] == PNG, proc.stderr


_WRITER = """
import os, signal, sys
from mpisync._runtime.observe import Timeline
t = Timeline(sys.argv[1], 3)
sizes = []
for sync in range(300):
    for k in range(7):
        t.span("cross-memory" if k == 3 else "pack", t.now(), tensors=k)
    t.flush()
    sizes.append(os.path.getsize(sys.argv[1]))
    if sync == 0:
        import json; json.load(open(sys.argv[1]))  # valid after every flush
steps = {b - a for a, b in zip(sizes, sizes[1:])}
print(len(steps) <= 3 and max(steps) < 2000, sizes[0], sizes[-1], flush=True)
t.span("lost", t.now())  # recorded after the last flush: lost with the process
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_timeline_streams_at_constant_cost_and_survives_a_killed_job(
    installed, bounded_env, tmp_path
):
    path = tmp_path / "killed.json"
    proc = subprocess.run(
        [sys.executable, "-c", _WRITER, str(path)],
        env=installed.env(bounded_env),
        cwd=installed.home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.startswith("True "), proc.stdout  # each flush appends the same few bytes
    trace = json.loads(path.read_text())  # valid JSON though the process was killed
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 300 * 7 and {e["name"] for e in events} == {"pack", "cross-memory"}
    assert all(e["pid"] == 3 for e in events)
    cut = tmp_path / "cut.json"  # a file cut in the middle of an event still renders what is whole
    text = path.read_text()
    cut.write_text(text[: len(text) // 2])
    render = installed.run(["timeline", cut, "--out", tmp_path / "cut.png"], bounded_env)
    assert render.returncode == 0 and (tmp_path / "cut.png").read_bytes()[:8] == PNG, render.stderr


def test_timeline_reports_unreadable_files(installed, bounded_env, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json at all")
    proc = installed.run(
        ["timeline", bad, tmp_path / "missing.json", "--out", tmp_path / "x.png"], bounded_env
    )
    assert proc.returncode == 2 and f"no such file: {tmp_path / 'missing.json'}" in proc.stderr
    proc = installed.run(["timeline", bad, "--out", tmp_path / "x.png"], bounded_env)
    assert (
        proc.returncode == 1
        and "not a Chrome trace" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_messages_count_in_the_singular_and_plural(installed, bounded_env, tmp_path):
    script = tmp_path / "one.py"
    script.write_text(
        "import numpy as np, mpisync\nmpisync.sync_params({'w': np.zeros(3)})\n"
        "mpisync.sync_params({'a': np.zeros(3), 'b': np.zeros(5)})\n"
    )
    env = installed.env(dict(bounded_env, MPISYNC_LOG="info"))
    proc = subprocess.run(
        ["mpiexec", "-n", "2", sys.executable, script],
        env=env,
        cwd=installed.home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "rank 1/2: synced 1 tensor (1 replica, " in proc.stderr
        and ", 1 fused bucket, " in proc.stderr
    )
    assert "rank 1/2: synced 2 tensors (2 replicas, " in proc.stderr, proc.stderr


def test_bench_takes_the_torch_form_of_each_workload():
    # The suite runs "<workload>-torch" (torch CPU tensors, one allocation per tensor): the option
    # check made before any work must take it too, and still refuse a misspelt one.
    from mpisync.tools import cli

    assert cli._bench_problem(["--workloads", "resnet50-torch,many-small"])[1] == ""
    problem = cli._bench_problem(["--workloads", "resnet5O-torch"])[1]
    assert problem.startswith("unknown workload(s) resnet5O-torch; choose from resnet50")


def test_bench_allreduce_options_are_checked_before_any_work():
    from mpisync.tools import cli

    assert cli._bench_problem(["--allreduce"])[1] == ""
    assert (
        cli._bench_problem(["--allreduce", "grads", "--allreduce-sets", "many-small,resnet50"])[1]
        == ""
    )
    assert cli._bench_problem(["--allreduce", "grads,sweeps"])[1] == (
        "--allreduce: unknown row(s) sweeps; choose from sweep, grads, ddp, collectives, check"
    )
    assert cli._bench_problem(["--allreduce=", "--no-osu"])[1].startswith(
        "--allreduce takes comma-separated rows"
    )
    assert cli._bench_problem(["--allreduce", "grads", "--allreduce-sets", "gpt2"])[1] == (
        "--allreduce-sets: unknown set(s) gpt2; choose from resnet50, bert-base, many-small"
    )


def test_a_failed_staging_is_one_clean_line(installed, bounded_env, tmp_path):
    # Progress on (the default): no bar for a file that is not there, no doubled prefix.
    missing = tmp_path / "nowhere.npz"
    proc = installed.run(
        ["stage-checkpoint", missing, "--to", tmp_path / "out" / "x.npz"], bounded_env, ranks=2
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        proc.stderr == f"mpisync stage-checkpoint: error: checkpoint '{missing}' does not exist\n"
    )
    src = tmp_path / "ckpt.bin"
    src.write_bytes(b"x" * 4096)
    proc = installed.run(["stage-checkpoint", src, "--to", "/proc/mpisync-test/x.bin"], bounded_env)
    assert proc.returncode == 1 and proc.stderr.startswith(
        "mpisync stage-checkpoint: error: checkpoint staging failed before streaming; no DEST was "
        "written: rank 0"
    ), proc.stderr
    assert proc.stderr.count("\n") == 1 and "\r" not in proc.stderr and "0.00" not in proc.stderr
