"""Check that every public name of mpisync is documented the way the manual renders it.

Usage: python ci/doc_coverage.py [--modules mpisync mpisync.torch mpisync.horovod]
                                  [--inventory OUT/objects.inv]

For every name in each module's ``__all__`` (Google-style sections, as napoleon reads them):

- a function or method has a docstring; an ``Args:`` section naming each parameter (besides
  ``self``/``cls``) when it takes any; a type hint on each parameter and on its return; a
  ``Returns:`` (or ``Yields:``) section unless it returns ``None``; and a ``Raises:`` section
  when it takes parameters (a call users make with input that can be refused);
- a class has a docstring; when its ``__init__`` is mpisync's own and takes parameters, the
  class or ``__init__`` docstring has an ``Args:`` section naming each (``Attributes:`` for a
  dataclass's fields) and each is type-hinted; each public method and property it defines, or
  inherits from an mpisync class, is checked as above (a property needs a docstring only);
- a method that implements another library's interface (the name exists on a base class from
  outside mpisync, such as torch's ``ProcessGroup``) is documented by that library: it needs a
  docstring only;
- an exception needs a docstring, and an ``Args:`` section only when it defines its own
  ``__init__`` with parameters;
- a member whose docstring says ``:meta private:`` (autodoc's marker) is left out, as the
  manual leaves it out; module-level data is not checked;
- with ``--inventory`` (the built manual's ``objects.inv``), every name has an entry in the
  manual, data included.

Prints each problem as ``module.name: what is missing`` and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
import sys

_DEFAULT_MODULES = ["mpisync", "mpisync.torch", "mpisync.horovod"]
_SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
_ENTRY = re.compile(r"^\s+(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*:")
_ARG_SECTIONS = ("Args", "Arguments", "Parameters", "Keyword Args", "Keyword Arguments")


def sections(doc: str) -> dict[str, list[str]]:
    """The docstring's Google-style sections: header -> its indented lines."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in doc.splitlines():
        header = _SECTION.match(line)
        if header:
            current = found.setdefault(header.group(1), [])
        elif current is not None and (not line.strip() or line.startswith((" ", "\t"))):
            current.append(line)
        else:
            current = None
    return found


def documented_names(found: dict[str, list[str]], kinds: tuple[str, ...]) -> set[str]:
    """The entry names (``name:`` / ``name (type):``) of the sections ``kinds``."""
    names = set()
    for kind in kinds:
        lines = [line for line in found.get(kind, []) if line.strip()]
        if not lines:
            continue
        indent = min(len(line) - len(line.lstrip()) for line in lines)
        for line in lines:
            match = _ENTRY.match(line)
            if match and len(line) - len(line.lstrip()) == indent:
                names.add(match.group(1).lstrip("*"))
    return names


def _parameters(signature: inspect.Signature) -> list[inspect.Parameter]:
    return [p for p in signature.parameters.values() if p.name not in ("self", "cls")]


def _signature(obj) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature
        return None


def _returns_none(annotation) -> bool:
    return annotation is None or annotation is type(None) or annotation in ("None", "'None'")


def check_callable(obj, doc: str | None, *, is_init: bool = False) -> list[str]:
    """The problems of one function or method (``is_init``: a class's constructor)."""
    if not doc:
        return ["no docstring"]
    doc = inspect.cleandoc(doc)
    signature = _signature(obj)
    if signature is None:
        return []
    found = sections(doc)
    problems = []
    params = _parameters(signature)
    if params:
        kinds = _ARG_SECTIONS + (("Attributes",) if is_init else ())
        named = documented_names(found, kinds)
        if not any(kind in found for kind in kinds):
            problems.append("no Args section")
        else:
            missing = [p.name for p in params if p.name not in named]
            if missing:
                problems.append(f"Args section lacks {', '.join(missing)}")
        unhinted = [p.name for p in params if p.annotation is inspect.Parameter.empty]
        if unhinted:
            problems.append(f"no type hint on {', '.join(unhinted)}")
    if is_init:
        return problems
    if signature.return_annotation is inspect.Signature.empty:
        problems.append("no return type hint")
    elif not _returns_none(signature.return_annotation) and not (
        "Returns" in found or "Return" in found or "Yields" in found
    ):
        problems.append("no Returns section")
    if params and "Raises" not in found:
        problems.append("no Raises section")
    return problems


def _ours(cls, package: str) -> bool:
    return cls.__module__ == package or cls.__module__.startswith(package + ".")


def _private(doc: str | None) -> bool:
    return bool(doc) and ":meta private:" in doc


def check_class(cls, package: str = "mpisync") -> dict[str, list[str]]:
    """The problems of a class and of its public members: member ('' for the class) -> list.

    ``package``'s classes are the ones whose constructors and methods are checked; the others
    (torch's, the standard library's) are the interfaces a member may implement.
    """
    report: dict[str, list[str]] = {}
    doc = inspect.getdoc(cls) if cls.__doc__ else None
    if not doc:
        report[""] = ["no docstring"]
        return report
    init = cls.__dict__.get("__init__")
    if issubclass(cls, BaseException):
        if init is not None and _signature(init) is not None and _parameters(_signature(init)):
            report[""] = check_callable(init, doc + "\n" + (init.__doc__ or ""), is_init=True)
        return {k: v for k, v in report.items() if v}
    owner = next((c for c in cls.__mro__ if "__init__" in c.__dict__), object)
    if _ours(owner, package):
        init_doc = inspect.getdoc(owner.__init__) or ""
        combined = doc + "\n" + init_doc
        if dataclasses.is_dataclass(cls):
            combined = combined.replace("Attributes:", "Args:")
        report[""] = check_callable(owner.__init__, combined, is_init=True)
    foreign = [c for c in cls.__mro__ if not _ours(c, package) and c is not object]
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not _ours(klass, package):
            continue
        for name, raw in klass.__dict__.items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(raw, property):
                member_doc = raw.__doc__
                problems = [] if member_doc else ["no docstring"]
            elif isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(raw):
                function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
                member_doc = inspect.getdoc(function)
                if _private(member_doc):
                    continue
                if any(hasattr(base, name) for base in foreign):
                    problems = [] if member_doc else ["no docstring"]
                else:
                    problems = check_callable(function, member_doc)
            else:
                continue  # class attributes and nested classes: data
            if problems:
                report[name] = problems
    return {k: v for k, v in report.items() if v}


def check_module(module_name: str) -> tuple[int, list[str]]:
    """``(names checked, problem lines)`` for one module's ``__all__``."""
    module = importlib.import_module(module_name)
    lines = []
    names = list(getattr(module, "__all__", []))
    for name in names:
        obj = getattr(module, name)
        where = f"{module_name}.{name}"
        if inspect.isclass(obj):
            for member, problems in check_class(obj).items():
                label = f"{where}.{member}" if member else where
                lines.append(f"{label}: {'; '.join(problems)}")
        elif callable(obj):
            problems = check_callable(obj, inspect.getdoc(obj) if obj.__doc__ else None)
            if problems:
                lines.append(f"{where}: {'; '.join(problems)}")
    return len(names), lines


def manual_entries(path: str) -> set[str]:
    """The Python objects the built manual documents (its Sphinx inventory)."""
    from sphinx.util.inventory import InventoryFile

    with open(path, "rb") as stream:
        inventory = InventoryFile.load(stream, "", lambda base, uri: uri)
    return {name for kind, names in inventory.items() if kind.startswith("py:") for name in names}


def missing_entries(module_name: str, entries: set[str]) -> list[str]:
    """The names of ``module_name.__all__`` without an entry in the manual."""
    module = importlib.import_module(module_name)
    return [
        f"{module_name}.{name}: no entry in the manual"
        for name in getattr(module, "__all__", [])
        if f"{module_name}.{name}" not in entries
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="+", default=_DEFAULT_MODULES, metavar="MODULE")
    parser.add_argument("--inventory", metavar="OBJECTS_INV", help="the built manual's objects.inv")
    args = parser.parse_args(argv)
    entries = manual_entries(args.inventory) if args.inventory else None
    total, problems = 0, []
    for module_name in args.modules:
        count, lines = check_module(module_name)
        total += count
        problems += lines
        if entries is not None:
            problems += missing_entries(module_name, entries)
    for line in problems:
        print(line)
    modules = ", ".join(args.modules)
    print(f"doc coverage: {total} public names of {modules}: {len(problems)} incomplete")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
