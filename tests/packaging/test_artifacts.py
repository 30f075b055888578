"""The built artifacts, as a user gets them from an index: the wheel and the sdist are built
(``python -m build``: the sdist first, the wheel from the unpacked sdist), both must carry the
package data (the Lua scripts, the web assets, ``py.typed``), and the wheel alone, installed
into a new virtualenv (not editable, no PYTHONPATH, run from outside the repository), runs
``examples/refund.py`` and ``celery -A <app> aaa --help``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.build

#: Files inside the package that are not package data (notes beside the code).
NOT_DATA = (".py", ".pyc", ".md")

TINY_APP = """\
from celery import Celery

app = Celery("tiny", broker="memory://", backend="cache+memory://")
app.conf.aaa_store_url = "memory://"
"""


def package_data() -> set[str]:
    """Every file of the package that is not a module: the Lua scripts, the web assets,
    ``py.typed`` (pyproject's package-data must list them all)."""
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "aaa_celery").rglob("*")
             if p.is_file() and p.suffix not in NOT_DATA and "__pycache__" not in p.parts}
    kinds = {"py.typed", ".lua", "contrib/assets/"}
    assert all(any(k in f for f in files) for k in kinds), files  # a vacuous check would pass anything
    return files


def clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user's shell with the new venv activated: nothing of the repo's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "AAA_"))}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # from a copy of the checkout's files (what git tracks or would): the build writes
    # *.egg-info and build/ beside the sources it builds
    src = out / "src"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], cwd=out, env=dict(os.environ),
        timeout_s=600)
    return out


def test_the_sdist_and_the_wheel_carry_the_package_data(dist: Path) -> None:
    [sdist] = dist.glob("aaa_celery-*.tar.gz")
    [wheel] = dist.glob("aaa_celery-*.whl")
    with tarfile.open(sdist) as tar:
        top = f"{sdist.name.removesuffix('.tar.gz')}/"
        in_sdist = {m.name.removeprefix(top) for m in tar.getmembers()}
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    expected = package_data()
    assert not expected - in_sdist, sorted(expected - in_sdist)
    assert not expected - in_wheel, sorted(expected - in_wheel)
    assert {"pyproject.toml", "README.md"} <= in_sdist


def test_the_wheel_alone_in_a_new_venv_runs_the_example_and_the_cli(dist: Path, tmp_path: Path) -> None:
    [wheel] = dist.glob("aaa_celery-*.whl")
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(venv)], cwd=tmp_path, env=clean_env(venv), timeout_s=120)
    env = clean_env(venv)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)], cwd=tmp_path, env=env,
        timeout_s=600)

    where = run([python, "-c", "import aaa_celery; print(aaa_celery.__file__)"], cwd=tmp_path, env=env,
                timeout_s=60)
    assert where.strip().startswith(str(venv)), where  # the installed wheel, not the checkout

    shutil.copy(ROOT / "examples" / "refund.py", tmp_path / "refund.py")
    out = run([python, "refund.py"], cwd=tmp_path, env=env, timeout_s=120)
    assert "refunded A-100 (key=refund:A-100, attempt=1, fence=1)" in out, out

    (tmp_path / "tinyapp.py").write_text(TINY_APP)
    help_text = run([str(venv / "bin" / "celery"), "-A", "tinyapp", "aaa", "--help"], cwd=tmp_path, env=env,
                    timeout_s=120)
    assert "Usage:" in help_text and "calls" in help_text and "doctor" in help_text, help_text
