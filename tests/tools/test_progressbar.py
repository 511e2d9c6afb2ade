"""Progress on stderr: a tqdm bar on a terminal only; plain lines (no carriage returns) in a log or
a pipe; nothing more once the work failed."""

import io

import pytest

from mpisync.tools.progressbar import Progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_when_the_stream_is_not_a_terminal():
    pytest.importorskip("tqdm")  # even with tqdm there: no bar in a batch log
    log = io.StringIO()
    bar = Progress("mpisync bench", 3, stream=log)
    for label in ("osu", "resnet50", "resnet50: memory"):
        bar.update(1, label)
    bar.close()
    assert "\r" not in log.getvalue()
    lines = log.getvalue().splitlines()
    assert lines[0] == "mpisync bench: 1/3 steps (33%) osu"
    assert lines[-1] == "mpisync bench: 3/3 steps (100%) resnet50: memory"


def test_a_bar_on_a_terminal():
    pytest.importorskip("tqdm")
    screen = _Terminal()
    bar = Progress("stage-checkpoint", 100, unit="B", stream=screen)
    bar.update(50)
    bar.close()
    assert "\r" in screen.getvalue() and "stage-checkpoint" in screen.getvalue()


def test_no_last_line_after_a_failure():
    log = io.StringIO()
    bar = Progress("stage-checkpoint", 1 << 20, unit="B", stream=log)
    bar.close(ok=False)
    assert log.getvalue() == ""
    done = Progress("stage-checkpoint", 1 << 20, unit="B", stream=log)
    done.close()
    assert log.getvalue() == "stage-checkpoint: 0 B/1.0 MB (0%)\n"
