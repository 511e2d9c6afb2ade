"""``python -m mpisync.horovod SCRIPT [ARGS...]``: a Horovod PyTorch script, unchanged
(:mod:`mpisync.horovod.runner`)."""

import sys

from .runner import main

sys.exit(main())
