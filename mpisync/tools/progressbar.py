"""Progress of the command-line tools on stderr: a tqdm bar with its total, or plain-text lines.

tqdm comes with ``mpisync[bench]``; without it, with ``plain=True``, or when the stream is not a
terminal (a batch job's log, a pipe: no ``\r`` piling up there), a line such as
``mpisync bench: 3/12 steps (25%) resnet50`` is printed at most once a second, and once at the
end of a run that succeeded.
"""

from __future__ import annotations

import sys as _sys
import time as _time

__all__ = ["Progress"]

_PLAIN_EVERY_S = 1.0


def _amount(n: float, unit: str) -> str:
    if unit != "B":
        return f"{int(n)}"
    for name, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {name}"
    return f"{int(n)} B"


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """``update(n, label)`` as work completes, ``close()`` at the end; a bar only where
    ``enabled``."""

    def __init__(
        self,
        desc: str,
        total: int,
        *,
        unit: str = "step",
        enabled: bool = True,
        plain: bool = False,
        stream=None,
    ):
        self.desc, self.total, self.unit = desc, int(total), unit
        self.done = 0
        self._stream = stream if stream is not None else _sys.stderr
        self._bar = None
        self._plain = False
        self._last = 0.0
        self._label = ""
        if not enabled:
            return
        if not plain and _is_terminal(self._stream):
            try:
                from tqdm import tqdm

                self._bar = tqdm(
                    total=self.total,
                    desc=desc,
                    unit=unit,
                    unit_scale=unit == "B",
                    file=self._stream,
                    leave=False,
                )
                return
            except ImportError:
                pass
        self._plain = True

    def update(self, n: int = 1, label: str = "") -> None:
        """Count ``n`` more units done; ``label`` says what is running."""
        self.done += n
        if self._bar is not None:
            if label:
                self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(n)
        elif self._plain:
            self._label = label or self._label
            now = _time.monotonic()
            if now - self._last >= _PLAIN_EVERY_S or self.done >= self.total:
                self._last = now
                self._line()

    def _line(self) -> None:
        unit = "" if self.unit == "B" else f" {self.unit}{'' if self.total == 1 else 's'}"
        share = f" ({100 * self.done // self.total}%)" if self.total > 0 else ""
        label = f" {self._label}" if self._label else ""
        print(
            f"{self.desc}: "
            f"{_amount(self.done, self.unit)}/{_amount(self.total, self.unit)}{unit}{share}{label}",
            file=self._stream,
            flush=True,
        )

    def close(self, ok: bool = True) -> None:
        """End the bar: a last plain line if the end was not shown yet, none when the work failed
        (``ok=False``: the error says what happened, a bar would only add noise)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._plain and ok and self.done < self.total:
            self._line()
        self._plain = False
