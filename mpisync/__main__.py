"""``python -m mpisync``: the same as the ``mpisync`` command."""

from .cli import main

raise SystemExit(main())
