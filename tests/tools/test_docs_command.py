"""`mpisync docs`: the documentation's address, and this checkout's docs/ folder."""

from pathlib import Path

from mpisync.tools import cli

REPO = Path(__file__).resolve().parents[2]


def test_docs_prints_the_url_and_this_checkouts_folder(capsys):
    assert cli.main(["docs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"documentation: {cli.docs_url()}"
    assert cli.docs_url().startswith("https://") and cli.docs_url().rstrip("/").endswith("docs")
    assert lines[1] == f"this checkout's copy: {REPO / 'docs'} (start at index.md)"
    assert (REPO / "docs" / "index.md").is_file()


def test_docs_url_matches_the_package_metadata():
    setup_cfg = (REPO / "setup.cfg").read_text()
    assert f"Documentation = {cli.DOCS_URL}" in setup_cfg


def test_help_names_the_docs(capsys):
    try:
        cli.main(["--help"])
    except SystemExit as stop:
        assert stop.code == 0
    out = capsys.readouterr().out
    words = " ".join(out.split())
    assert "`mpisync docs`" in words and cli.docs_url() in words
