"""The previous release, 0.1.0 (commit c79799f), built from this repository's history into
a venv of its own, for the upgrade test and the mixed-version chaos run.

:func:`build` (once per run: ``old_release`` fixture; under xdist :func:`built` finds another worker's) makes a ``git worktree`` of the
commit in a temp dir and ``pip install --no-deps``-es it into a venv made without pip,
whose only view of the shared packages (celery, redis, SQLAlchemy, ...) is a ``.pth``
line naming this interpreter's site-packages. A ``.pth`` line adds a directory to
``sys.path`` without running the ``.pth`` files inside it, so the shared venv's editable
install of the new code is not seen there: ``import aaa_celery`` in the old venv is
0.1.0's, from its own site-packages. :func:`env` is the environment to run it in (no
``PYTHONPATH``, which would put this checkout's code first).

A checkout without that commit (a shallow clone) installs ``tests/releases/``'s wheel
instead: the same commit built once with ``pip wheel --no-deps`` (``tests/releases/README.md``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The commit of 0.1.0 (CHANGELOG.md).
RELEASE_0_1_0 = "c79799f"
#: 0.1.0 built from that commit, for a checkout without its history.
WHEEL_0_1_0 = ROOT / "tests" / "releases" / "aaa_celery-0.1.0-py3-none-any.whl"


@dataclass(frozen=True)
class OldRelease:
    python: Path
    venv: Path
    version_file: Path  # aaa_celery/__init__.py of the installed copy (to check which code runs)

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), *args], env=env(), capture_output=True, text=True, **kw)


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an old-release process: this one's, without ``PYTHONPATH``."""
    out = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**out, **(extra or {})}


def build(where: Path, commit: str = RELEASE_0_1_0) -> OldRelease:
    tree, venv = where / "tree", where / "venv"
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if found.returncode == 0:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), commit], check=True,
                       capture_output=True, text=True)
        source = str(tree)
    else:  # a shallow clone: the same commit's wheel, kept in the repository for this case
        assert commit == RELEASE_0_1_0 and WHEEL_0_1_0.is_file(), (
            f"commit {commit} is not in this checkout's history and no wheel of it is kept")
        source = str(WHEEL_0_1_0)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True, env=env()).stdout.strip()
        Path(site, "aaa_shared_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        # This interpreter's pip installs into the old venv (its build backend, setuptools,
        # comes from pip's wheel cache after the first run: a few seconds).
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--disable-pip-version-check", "--no-compile", source],
                       check=True, capture_output=True, text=True, env=env(), cwd=where)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    release = _checked(where)
    (where / "built").write_text(commit)
    return release


def built(where: Path) -> OldRelease | None:
    """The release :func:`build` finished in ``where`` before (another xdist worker's), if any."""
    return _checked(where) if (where / "built").is_file() else None


def _checked(where: Path) -> OldRelease:
    venv = where / "venv"
    python = venv / "bin" / "python"
    found = subprocess.run([str(python), "-c", "import aaa_celery; print(aaa_celery.__file__)"], check=True,
                           capture_output=True, text=True, env=env(), cwd=where).stdout.strip()
    assert found.startswith(str(venv)), f"the old venv imports aaa_celery from {found}, not its own copy"
    return OldRelease(python, venv, Path(found))
