"""Every command the README and the docs site tell a user to run, run as written (issue 42).

Each shell or Python block of a page is run here, in the page's order, or is marked in the
page as illustrative (``doc_blocks.py``). The run starts where a new user starts: a clone of
this repository and a new virtualenv (Getting started, section 1), in which the README's and
the home page's quickstart then run too. A block runs in a shell session of its own that
carries on the one before it as a user's terminal would: its working directory and exported
variables.

What the runner does that a user does not, and nothing more:

- ``<this repository>`` is this checkout, and ``<call id>`` the last line the block before
  printed (the page says to use the id it printed);
- the Redis server a page starts (``redis-server ...``) is one of this test's own, on a free
  port that stands in for 6379 wherever the page writes it;
- ``scripts/test`` (the command that runs this test) is not run inside it.

Every process a block leaves running (``&``) is stopped by its process group when the page
is done, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..servers import RedisServer, ServerUnavailable
from .doc_blocks import ROOT, Block, blocks, command_blocks, output_after

pytestmark = pytest.mark.redis

#: The pages that run, in the order a newcomer reads them: Getting started makes the clone and
#: the virtualenv that the quickstarts then use.
ORDER = ["docs/getting-started.md", "README.md", "docs/index.md"]

REDIS_LINE = re.compile(r"^\s*redis-server\b.*$", re.M)
SUITE_LINE = re.compile(r"^\s*scripts/test\b.*$", re.M)


def report(request: pytest.FixtureRequest, line: str) -> None:
    """A line in the run's log, past pytest's capture."""
    with request.getfixturevalue("capsys").disabled():
        print(line, file=sys.stderr, flush=True)


def test_every_command_block_is_run_or_marked_illustrative(request):
    """The listing of what ran and what is illustrative, and no block left undecided."""
    undecided = []
    for block in command_blocks():
        if block.mark == "illustrative":
            report(request, f"docs block {block.where}: illustrative: {block.reason}")
        elif block.page in ORDER:
            report(request, f"docs block {block.where}: run")
        else:
            undecided.append(block.where)
    assert not undecided, ("blocks neither run (a page in ORDER) nor marked "
                           f"<!-- illustrative: why -->: {undecided}")
    for block in command_blocks():
        if block.mark == "illustrative":
            assert block.reason, f"{block.where}: say why it is not run as written"


class Terminal:
    """A user's terminal: a working directory and exported variables carried from one block
    to the next, and the process groups of what the blocks started."""

    def __init__(self, workdir: Path, redis_port: int) -> None:
        self.workdir = workdir
        self.cwd = workdir
        self.env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "BROKER_URL")}
        # The suite's virtualenv is not the newcomer's: its bin leaves PATH.
        suite_bin = str(Path(sys.executable).parent)
        self.env["PATH"] = os.pathsep.join(p for p in self.env["PATH"].split(os.pathsep) if p != suite_bin)
        self.redis_port = redis_port
        self.groups: list[int] = []
        self.last_output = ""
        self.count = 0

    def fill(self, text: str) -> str:
        text = text.replace("<this repository>", shlex.quote(str(ROOT)))
        if "<call id>" in text:
            printed = [line for line in self.last_output.splitlines() if line.strip()]
            assert printed, "the block before printed no call id"
            text = text.replace("<call id>", printed[-1].strip())
        text = REDIS_LINE.sub(": the runner started redis-server", text)
        text = SUITE_LINE.sub(": scripts/test runs this runner", text)
        return text.replace("6379", str(self.redis_port))

    def run(self, block: Block, timeout_s: float = 900) -> str:
        self.count += 1
        state = self.workdir / f".block{self.count}"
        out = self.workdir / f".block{self.count}.out"
        text = self.fill(block.text)
        if block.language == "python":
            (self.workdir / f".block{self.count}.py").write_text(text)
            script = f"python - < {shlex.quote(str(self.workdir / f'.block{self.count}.py'))}\n"  # as typed: '' on sys.path
        else:
            script = text
        wrapper = (f"set -eo pipefail\ntrap 'pwd > {state}.cwd; export -p > {state}.env' EXIT\n"
                   f"cd {shlex.quote(str(self.cwd))}\n{script}")
        with open(out, "wb") as sink:
            proc = subprocess.Popen(["bash", "-c", wrapper], env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self.groups.append(proc.pid)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
        output = out.read_text(errors="replace")
        assert code == 0, f"{block.where} exited {code}:\n{text}\n--- output ---\n{output[-6000:]}"
        self._carry(state)
        self.last_output = output
        return output

    def _carry(self, state: Path) -> None:
        cwd = Path(f"{state}.cwd")
        if cwd.exists():
            self.cwd = Path(cwd.read_text().strip())
        exported = Path(f"{state}.env")
        if exported.exists():
            parsed = subprocess.run(["bash", "-c", f"source {shlex.quote(str(exported))} 2>/dev/null; env -0"],
                                    capture_output=True, env={}, check=True).stdout
            self.env = dict(item.split("=", 1) for item in parsed.decode().split("\0") if "=" in item)

    def stop(self) -> None:
        """Stop what the blocks left running, by process group: TERM, then KILL."""
        for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
            alive = []
            for group in self.groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, sig)
                    alive.append(group)
            deadline = time.monotonic() + wait_s
            while alive and time.monotonic() < deadline:
                alive = [g for g in alive if _group_alive(g)]
                time.sleep(0.2)
            if not alive:
                return


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    try:
        redis = RedisServer.start()
    except ServerUnavailable as e:
        pytest.skip(str(e))
    shell = Terminal(tmp_path, redis.port or 0)
    try:
        yield shell
    finally:
        shell.stop()
        redis.stop()


def test_the_newcomers_path_runs_as_written(terminal, request):
    """Getting started top to bottom (a clone, a new virtualenv, the refund agent, Redis and a
    worker, a call and its timeline), then the README's and the home page's quickstart in
    that clone, each printed output compared with what the page shows."""
    for page in ORDER:
        for block in blocks(ROOT / page):
            if not block.is_command or block.mark == "illustrative":
                continue
            started = time.monotonic()
            output = terminal.run(block)
            report(request, f"docs block {block.where}: ran in {time.monotonic() - started:.1f} s")
            shown = output_after(block)
            if shown is not None:
                expected = shown.text.strip()
                assert expected in output, f"{block.where} printed:\n{output[-3000:]}\n--- the page shows ---\n{expected}"
            if "aaa show" in block.text:
                assert "state completed" in output and "result: completed by attempt 1" in output, output
