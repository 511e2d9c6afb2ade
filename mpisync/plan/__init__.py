"""Internal, no stability promise: the broadcast plan.

The broadcast plan: transfers, spans, the fusion arena, compiled programs, prepared sets."""
