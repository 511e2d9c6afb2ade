"""Internal, no stability promise: parameter sets.

Parameter sets: array adapters, the manifest (what a rank holds), agreement, verification,
fan-out."""
