"""Internal, no stability promise: the transports.

Transports move root's bytes into every rank's masters: MPI, cross-memory copies, the
device path; which one a sync takes (selection, tuning file)."""
