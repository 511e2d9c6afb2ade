"""``python -m mpisync``: the same as the ``mpisync`` command."""

from .tools.cli import main

raise SystemExit(main())
