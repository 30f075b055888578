"""Each consumer of a store is typed by the interface it uses (stores/base.py), never by the
whole ``Store``: the guard by ``GuardStore``, recovery by ``RecoveryStore``, operators by
``OperatorStore``, runs by ``RunStore``. Only the factories, the backends and the metrics'
wrapper (itself a whole store) take a whole ``Store``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "aaa_celery"

#: Modules that may take a whole Store, and why.
ALLOWED = {
    "stores/__init__.py": "the factory (open_store, backend_for)",
    "worker/stores.py": "the app's store: the factory of a worker's and a producer's store",
    "worker/metrics.py": "MeteredStore is a whole Store wrapping a whole Store",
    "runtime/engine.py": "Engine(store=) installs the app's store, which its embedded worker's guard uses",
}
#: The backends implement Store; they do not consume one.
BACKENDS = ("stores/memory.py", "stores/runs_memory.py", "stores/sqlite.py", "stores/postgres.py",
            "stores/redis/", "stores/sql/")


def _names_store(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _names_store(ast.parse(annotation.value, mode="eval").body)
    return any((isinstance(n, ast.Name) and n.id == "Store") or (isinstance(n, ast.Attribute) and n.attr == "Store")
               for n in ast.walk(annotation))


def whole_store_parameters(source: str) -> list[str]:
    """``line: name`` of every parameter, and every field of a class (a dataclass's
    parameters), annotated with the whole ``Store``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]:
                if _names_store(arg.annotation):
                    found.append(f"{arg.lineno}: {arg.arg}")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and _names_store(item.annotation):
                    found.append(f"{item.lineno}: {ast.unparse(item.target)}")
    return found


def test_the_check_sees_a_parameter_and_a_field_typed_by_the_whole_store():
    source = ("def f(a: int, store: Store | None = None) -> Store: ...\n"
              "class C:\n    store: base.Store\n    other: CallStore\n"
              "def g(store: 'Store') -> None: ...\n")
    assert whole_store_parameters(source) == ["1: store", "3: store", "5: store"]


def test_no_consumer_module_takes_the_whole_store():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ALLOWED or rel.startswith(BACKENDS):
            continue
        found = whole_store_parameters(path.read_text())
        if found:
            offenders[rel] = found
    assert not offenders, f"typed by the whole Store instead of the interface they use: {offenders}"
