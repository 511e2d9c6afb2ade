"""How mpisync's waits poll: spin yielding the core for a while, then sleep between polls.

A wait that polls (an MPI request tested under a deadline) runs while nothing else on its rank
progresses: MPI's nonblocking collectives progress only inside MPI calls. So a wait first spins,
yielding the core to oversubscribed peers between polls, and backs off to short sleeps only after
a long stall. Every polling wait uses these two numbers (:mod:`mpisync._runtime.ring`,
:mod:`mpisync.torch.entry`).
"""

from __future__ import annotations

__all__ = ["SPIN_SECONDS", "SLEEP_SECONDS"]

#: How long a stalled wait keeps polling with ``sched_yield`` between polls.
SPIN_SECONDS = 0.5
#: The sleep between polls after that.
SLEEP_SECONDS = 0.001
