"""Sphinx configuration of the mpisync manual.

Build: ``python -m sphinx -W --keep-going -b html docs <out>`` (the ``docs`` extra). The API
reference is generated from the docstrings (Google style: ``Args:``, ``Returns:``,
``Raises:``); the Markdown pages of docs/ are the user guide.
"""

from __future__ import annotations

import os
import sys

# The checkout's package, ahead of any installed copy.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mpisync  # noqa: E402

project = "mpisync"
author = "the mpisync developers"
copyright = "the mpisync developers"  # noqa: A001 - the name Sphinx reads
version = release = mpisync.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# pypi.md is the package index's page (setup.cfg's long description), not a page of the manual.
exclude_patterns = ["_build", "pypi.md"]

# Markdown: headings get anchors so that the pages' ``page.md#section`` links resolve.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# API reference: Google-style sections, signatures with their type hints, members in source order.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_include_init_with_doc = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "alabaster"
html_title = f"mpisync {release}"
html_static_path: list[str] = []
