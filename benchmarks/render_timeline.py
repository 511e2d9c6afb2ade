"""Render mpisync Chrome-trace timelines as a PNG: kept for old scripts; use ``mpisync timeline``.

python benchmarks/render_timeline.py /tmp/tl-*.json --out docs/timeline.png [--sync N]
"""

import sys

from mpisync.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["timeline", *sys.argv[1:]]))
