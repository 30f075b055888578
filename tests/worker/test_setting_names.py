"""The known-settings table (aaa_celery.worker.setting_names.SETTINGS) names every ``aaa_*``
setting the package reads: a setting read in code but missing from it would be refused at
bind() as a typo. Found by reading the package's source, not by a list kept beside it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import aaa_celery
from aaa_celery.worker.setting_names import SETTINGS

PACKAGE = Path(aaa_celery.__file__).parent


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "aaa_..."`` (also ``A, B = "aaa_x", "aaa_y"``)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = (zip(target.elts, node.value.elts, strict=False)
                     if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                     else [(target, node.value)])
            for name, value in pairs:
                if isinstance(name, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found[name.id] = value.value
    return found


def read_settings() -> dict[str, str]:
    """Every ``aaa_*`` name the package reads as a Celery setting: the name given to
    ``conf.get(...)``, ``setting(app, ...)``, a ``get(...)`` of settings, or ``conf[...]``,
    as a literal or a module constant -> where it is read."""
    seen: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        constants = _constants(tree)

        def value(node: ast.AST) -> str | None:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value
            if isinstance(node, ast.Name):
                return constants.get(node.id)
            return None

        for node in ast.walk(tree):
            names: list[ast.AST] = []
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == "get":
                    names.append(node.args[0])
                elif called == "setting" and len(node.args) >= 2:
                    names.append(node.args[1])
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "conf":
                names.append(node.slice)
            for name in names:
                text = value(name)
                if text and re.fullmatch(r"aaa_[a-z0-9_]+", text):
                    seen.setdefault(text, f"{path.relative_to(PACKAGE.parent)}:{name.lineno}")
    return seen


def test_every_setting_the_package_reads_is_in_the_known_names_table():
    read = read_settings()
    assert {"aaa_store_url", "aaa_guard", "aaa_secret_key", "aaa_recovery_interval_s", "aaa_metrics_port",
            "aaa_rabbitmq_consumer_timeout_s", "aaa_allow_process_local_store"} <= set(read), read
    # read with .get too, but not settings: message headers, a sealed secret's key, a SQLite flag
    others = {"aaa_tenant", "aaa_run_id", "aaa_tool_call_id", "aaa_sealed", "aaa_read_only"}
    missing = {name: where for name, where in read.items() if name not in SETTINGS and name not in others}
    assert not missing, f"add these to aaa_celery/worker/setting_names.py SETTINGS: {missing}"


def test_the_table_names_only_aaa_settings_with_a_description():
    assert all(name.startswith("aaa_") and name.islower() and text for name, text in SETTINGS.items())
