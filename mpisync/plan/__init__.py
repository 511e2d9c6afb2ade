"""The broadcast plan: transfers, spans, the fusion arena, compiled programs, prepared sets."""
