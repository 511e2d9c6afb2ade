"""Check the manual's links and the code's references to it, and keep dates and hashes out.

Usage: python ci/check_docs.py [--root DIR]

Fails (exit 1, one line per problem) when:

- a Markdown link or a MyST ``{doc}`` reference in docs/**/*.md, README.md or CHANGES.md points
  to a file that does not exist, or to a heading anchor (``page.md#anchor``) the page lacks;
- a comment, docstring or string in mpisync/**/*.py, ci/**/*.py, benchmarks/*.py or examples/*
  names a docs/ page that does not exist, or a section of one (``docs/<page>.md#anchor``,
  ``docs/<page>.md, "Heading"`` or ``docs/<page>.md, Heading``) that the page has no heading
  for (a heading that starts with the words named counts);
- a date (``20XX-XX-XX``) or a commit hash (7-40 hexadecimal characters with a digit and a letter)
  appears in docs/ (CHANGES.md and benchmarks/results/ are exempt; a code-fence line that says
  ``digest`` may quote a digest) or in a comment or docstring of mpisync/.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from pathlib import Path

_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
_DOC_ROLE = re.compile(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`")
_FENCE = re.compile(r"^\s*(```|~~~|:::)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
_CODE_REF = re.compile(
    r"docs/([\w./-]+\.(?:md|rst))"
    r"(?:#([\w-]+)|,\s+\"([^\"]+)\"|,\s+([A-Z][\w' -]*[\w']))?"
)
_CONTINUATION = re.compile(r"\n[ \t]*(?:#:?[ \t]*)?")


def slug(heading: str) -> str:
    """The anchor MyST (``myst_heading_anchors``) and GitHub give a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The Markdown headings of ``path`` outside code fences, as written."""
    found, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.append(match.group(2))
    return found


def anchors(path: Path) -> set[str]:
    """Every anchor of ``path``'s headings, with the ``-1``, ``-2`` suffixes of repeats."""
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(path):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, re.sub(r"``[^`]*``|`[^`]*`", "", line)))
    return lines


def check_links(root: Path, page: Path) -> list[str]:
    """Problems with the links and ``{doc}`` references of one Markdown page."""
    problems = []
    for number, line in _prose_lines(page):
        targets = [a or b for a, b in _LINK.findall(line)]
        targets += [t if t.endswith(".md") else t + ".md" for t in _DOC_ROLE.findall(line)]
        for target in targets:
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(root)}:{number}"
            if not dest.exists():
                problems.append(f"{where}: link to a missing file: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: link to a missing heading: {target}")
    return problems


def _section_exists(page: Path, section: str) -> bool:
    wanted = re.sub(r"[`\s]+", " ", section).strip().lower()
    for heading in headings(page):
        text = re.sub(r"[`\s]+", " ", heading).strip().lower()
        if text == wanted or text.startswith(wanted):
            return True
    return False


def check_code_refs(root: Path, source: Path) -> list[str]:
    """Problems with the docs/ pages and sections that one source file names."""
    text = _CONTINUATION.sub(" ", source.read_text(encoding="utf-8"))
    problems = []
    for match in _CODE_REF.finditer(text):
        name, anchor, quoted, bare = match.groups()
        page = root / "docs" / name
        where = f"{source.relative_to(root)}"
        if not page.exists():
            problems.append(f"{where}: names a missing page: docs/{name}")
        elif anchor and anchor not in anchors(page):
            problems.append(f"{where}: names a missing section: docs/{name}#{anchor}")
        elif (quoted or bare) and not _section_exists(page, quoted or bare):
            problems.append(f"{where}: names a missing section: docs/{name}, {quoted or bare!r}")
    return problems


def _history_marks(text: str) -> list[str]:
    return _DATE.findall(text) + _HASH.findall(text)


def check_page_history(root: Path, page: Path) -> list[str]:
    """Dates and commit hashes in one page of docs/.

    A line of a code fence that says ``digest`` (a program's output quoting a content digest)
    may hold hexadecimal words; a date is refused there too."""
    problems, fenced = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        marks = _history_marks(line)
        if fenced and "digest" in line:
            marks = _DATE.findall(line)
        for mark in marks:
            problems.append(f"{page.relative_to(root)}:{number}: date or commit hash: {mark}")
    return problems


def _comments_and_docstrings(source: Path) -> list[tuple[int, str]]:
    found = []
    tokens = tokenize.generate_tokens(io.StringIO(source.read_text(encoding="utf-8")).readline)
    previous = tokenize.NEWLINE
    for token in tokens:
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and previous in (
            tokenize.NEWLINE,
            tokenize.NL,
            tokenize.INDENT,
            tokenize.DEDENT,
        ):
            found.append((token.start[0], token.string))
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    return found


def check_code_history(root: Path, source: Path) -> list[str]:
    """Dates and commit hashes in one module's comments and docstrings."""
    problems = []
    for number, text in _comments_and_docstrings(source):
        for mark in _history_marks(text):
            problems.append(f"{source.relative_to(root)}:{number}: date or commit hash: {mark}")
    return problems


def _files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if p.is_file())


def run(root: Path) -> list[str]:
    """Every problem the check finds in the tree at ``root``."""
    docs = _files(root, "docs/**/*.md")
    pages = docs + [p for p in (root / "README.md", root / "CHANGES.md") if p.exists()]
    problems = []
    for page in pages:
        problems += check_links(root, page)
    for page in docs:
        problems += check_page_history(root, page)
    sources = _files(root, "mpisync/**/*.py") + _files(root, "ci/**/*.py")
    sources += _files(root, "benchmarks/*.py") + _files(root, "examples/*")
    for source in sources:
        problems += check_code_refs(root, source)
    for source in _files(root, "mpisync/**/*.py"):
        problems += check_code_history(root, source)
    return problems


def main(argv: list[str] | None = None) -> int:
    """Print each problem found under ``--root`` (the repository by default); 1 if any."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    problems = run(args.root.resolve())
    for problem in problems:
        print(problem)
    print(f"check_docs: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
