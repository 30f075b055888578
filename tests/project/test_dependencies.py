"""Every third-party module that the package, its tests, its examples and its benchmarks
import comes from a distribution that pyproject.toml declares (in ``dependencies`` or an
extra, ``[dev]`` included), directly or as a requirement of a declared one (``werkzeug``
through ``flask``). CI installs exactly that into a new virtualenv (scripts/test), so an
undeclared import fails there; this test names it wherever the machine happens to have it.

Imports are read from the source (``ast``), at any depth (a lazy driver import inside a
function counts, and so does ``pytest.importorskip("x")``), except under ``if TYPE_CHECKING:``
and in the body of a ``try`` that catches ``ImportError`` (an optional module the code works
without; a test that needs one calls ``unavailable()`` there, which fails under ``CI=true``).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("aaa_celery", "tests", "examples", "benchmarks")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return [Requirement(r) for r in [*project.get("dependencies", []), *(r for rs in extras.values() for r in rs)]]


def installable(requirements: list[Requirement]) -> set[str]:
    """The distributions the requirements bring in, their own requirements (and the extras
    asked for) followed as far as they are installed here."""
    found: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = normalize(req.name)
        if name in found and not extras:
            continue
        found.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in (*extras, "")):
                if normalize(sub.name) not in found or sub.extras:
                    todo.append((sub, frozenset(sub.extras)))
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _constant_import(node: ast.Call) -> str | None:
    """The module of ``pytest.importorskip("x")`` or ``importlib.import_module("x")``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in ("importorskip", "import_module") and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
            return arg.value
    return None


def _optional(node: ast.Try) -> bool:
    """``try: import x`` / ``except ImportError:``: code that works without ``x``."""
    for handler in node.handlers:
        caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(c, ast.Name) and c.id in ("ImportError", "ModuleNotFoundError") for c in caught):
            return True
    return False


def imported(tree: ast.AST) -> Iterator[str]:
    """The modules ``tree`` imports absolutely (``from a.b import c`` gives ``a.b.c``, which
    may be a module or a name in ``a.b``)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Try) and _optional(node):
            todo.extend([*node.handlers, *node.orelse, *node.finalbody])
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and (module := _constant_import(node)):
            yield module
        todo.extend(ast.iter_child_nodes(node))


def _locate(module: str) -> tuple[str, list[Path]] | None:
    """The nearest of ``module`` and its parents (below the top) that is installed, with
    its file or (a namespace portion) its directories; None if none is."""
    while "." in module:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            if spec.origin not in (None, "namespace"):
                return module, [Path(spec.origin).resolve()]
            return module, [Path(p).resolve() for p in spec.submodule_search_locations or ()]
        module = module.rpartition(".")[0]
    return None


def distributions_of(module: str, providers: Mapping[str, list[str]]) -> tuple[str, set[str]]:
    """The module to name and the distributions that install it: ``packages_distributions``
    for a plain top-level package; inside a namespace package, the owner of the module's
    own files (``opentelemetry.instrumentation.celery`` is not ``opentelemetry-api``'s)."""
    top = module.partition(".")[0]
    dists = {normalize(d) for d in providers.get(top, ())}
    if len(dists) <= 1:
        return top, dists
    found = _locate(module)
    if found is None:
        return module, set()
    name, places = found
    owners = set()
    for dist in dists:
        for file in metadata.files(dist) or ():
            path = Path(str(file.locate())).resolve()
            if any(path == place or place in path.parents for place in places):
                owners.add(dist)
                break
    return name, owners


def sources() -> Iterator[Path]:
    for top in SCANNED:
        yield from sorted((ROOT / top).rglob("*.py"))


def local_modules() -> set[str]:
    """Module names the repository holds (a script's sibling, an example app's package)."""
    names = {p.stem for p in sources()}
    return names | {p.parent.name for p in sources() if p.name == "__init__.py"}


def third_party_imports() -> dict[str, set[str]]:
    """Each imported module that is neither the standard library's nor the repository's
    own, with the files importing it."""
    by_module: dict[str, set[str]] = {}
    for path in sources():
        for name in imported(ast.parse(path.read_text(), str(path))):
            by_module.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    providers = metadata.packages_distributions()
    local = local_modules()
    return {
        name: files for name, files in by_module.items()
        if (top := name.partition(".")[0]) not in sys.stdlib_module_names and top not in SCANNED
        and (top in providers or top not in local)
    }


def test_every_imported_third_party_module_is_declared_in_pyproject() -> None:
    declared = installable(declared_requirements())
    providers = metadata.packages_distributions()
    undeclared: dict[str, tuple[list[str], set[str]]] = {}
    for module, files in sorted(third_party_imports().items()):
        shown, dists = distributions_of(module, providers)
        if not dists & declared:
            entry = undeclared.setdefault(shown, (sorted(dists) or ["(not installed here)"], set()))
            entry[1].update(files)
    assert not undeclared, "\n".join(
        f"{module}: from {', '.join(dists)}, imported by {', '.join(sorted(files)[:3])}:"
        " declare it in pyproject.toml ([dev] for a test's import)" for module, (dists, files) in undeclared.items())


def test_the_check_sees_the_imports_it_must() -> None:
    """The scan finds what these tests import (a broken scan would pass everything)."""
    found = {name.partition(".")[0] for name in third_party_imports()}
    for module in ("celery", "pytest", "jsonschema", "yaml", "opentelemetry", "packaging"):
        assert module in found, module
    assert not {"aaa_celery", "tests", "os", "worker"} & found
    assert "opentelemetry.instrumentation.celery" in third_party_imports()
