"""The command-line tools: ``mpisync`` info, bench, tune, stage-checkpoint, timeline.

Nothing outside this package imports it."""
