"""The type check of CI: mypy with the project's settings (``[tool.mypy]`` in pyproject.toml).

The package and the examples must pass ``mypy --strict`` (one run on ``[tool.mypy]``'s
``files``, one on ``examples/django_project``, whose ``proj`` would clash with
``examples/fleet/proj.py``); a failure shows mypy's report.

``cases/*_ok.py`` is typed user code that must pass ``mypy --strict`` as it is;
``cases/*_errors.py`` has mistakes, each line marked ``# E: [code] text`` with the error
mypy must report there (and no line gets an error it does not expect). The ok cases also
run, so what the types promise is what a call does.

mypy keeps its cache in the repository's ``.mypy_cache``: a cold run (a fresh CI clone)
checks the package and the stubs once, in seconds; later runs reuse it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).parent / "cases"
LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*?)(?:  \[(?P<code>[a-z-]+)\])?$")
EXPECT = re.compile(r"# E: \[(?P<code>[a-z-]+)\](?P<text>[^#]*)")


@dataclass(frozen=True)
class Error:
    path: str
    line: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}  [{self.code}]"


def run_mypy(*targets: str) -> tuple[list[Error], str, int]:
    """mypy with the project's settings on ``targets`` (paths relative to the repository;
    none: the ``files`` of ``[tool.mypy]``): the errors it reports, its whole output for a
    failure message, and its exit status."""
    with contextlib.chdir(ROOT):  # mypy finds the package (this tree's, not an installed copy) from here
        stdout, stderr, status = api.run(["--config-file", "pyproject.toml", "--no-pretty",
                                          "--show-error-codes", "--hide-error-context", *targets])
    errors = [Error(m["path"], int(m["line"]), m["code"] or "", m["message"])
              for m in map(LINE.match, stdout.splitlines()) if m]
    return errors, stdout + stderr, status


@pytest.fixture(scope="module")
def reported() -> dict[str, list[Error]]:
    """Every case file checked in one mypy run (they share the package's analysis):
    the errors in each, by the case file's path."""
    cases = sorted(str(p.relative_to(ROOT)) for p in CASES.glob("*.py"))
    errors, _, _ = run_mypy(*cases)
    return {case: [e for e in errors if e.path == case] for case in cases}


def expected(case: Path) -> dict[int, list[tuple[str, str]]]:
    lines = case.read_text().splitlines()
    return {n: [(m["code"], m["text"].strip()) for m in EXPECT.finditer(text)]
            for n, text in enumerate(lines, 1) if "# E: [" in text}


OK_CASES = sorted(p.name for p in CASES.glob("*_ok.py"))
ERROR_CASES = sorted(p.name for p in CASES.glob("*_errors.py"))


@pytest.mark.parametrize("name", OK_CASES)
def test_typed_use_of_the_api_passes_mypy_strict(reported, name):
    errors = reported[f"tests/typing/cases/{name}"]
    assert not errors, "mypy --strict refuses typed use of the API:\n" + "\n".join(map(str, errors))


@pytest.mark.parametrize("name", ERROR_CASES)
def test_mistakes_are_reported_by_mypy(reported, name):
    path = f"tests/typing/cases/{name}"
    want = expected(CASES / name)
    got: dict[int, list[Error]] = {}
    for e in reported[path]:
        got.setdefault(e.line, []).append(e)
    problems = []
    for line, expectations in want.items():
        errors = got.get(line, [])
        for code, text in expectations:
            if not any(e.code == code and text in e.message for e in errors):
                problems.append(f"{path}:{line}: expected [{code}] {text!r}; mypy said: "
                                + ("; ".join(map(str, errors)) or "nothing"))
        codes = [code for code, _ in expectations]
        problems += [f"unexpected: {e}" for e in errors if e.code not in codes]
    problems += [f"unexpected: {e}" for line, errors in got.items() if line not in want for e in errors]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", OK_CASES)
def test_the_ok_cases_run_as_typed(name):
    spec = importlib.util.spec_from_file_location(f"typing_case_{name[:-3]}", CASES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "direct_calls"):
        asyncio.run(module.direct_calls())  # assert_type is a no-op at run time: the values are real


@pytest.mark.parametrize("targets", [(), ("examples/django_project",)], ids=["package-and-examples", "django-example"])
def test_the_package_and_the_examples_pass_mypy_strict(targets):
    _, output, status = run_mypy(*targets)
    assert status == 0, f"mypy --strict {' '.join(targets) or '(the files of [tool.mypy])'}:\n{output}"
