"""Internal, no stability promise: the command-line tools (public: the ``mpisync`` command).

The command-line tools: ``mpisync`` info, bench, tune, stage-checkpoint, timeline.

Nothing outside this package imports it."""
