"""Internal, no stability promise: what every layer uses.

What every layer uses: the request ring, deadlines and timeouts, logging and tracing, the
keep-alive list, the optional C loops."""
