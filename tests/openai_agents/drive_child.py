"""A web process that drives one agent run, for the tests that kill it: ``python -m
tests.openai_agents.drive_child <model base url> <run id> <input>`` (``AAA_AGENTS_REDIS`` set)."""

from __future__ import annotations

import asyncio
import os
import sys

from aaa_celery.contrib.openai_agents import AgentTools

from . import agents_app as aa
from .agent import drive, guarded


def main() -> None:
    base_url, run_id, text = sys.argv[1:4]
    guard = AgentTools(aa.make_app(os.environ[aa.ENV]), aa.handler())
    result = asyncio.run(drive(guard, guarded(guard, base_url), text, run_id))
    print(result.final_output)


if __name__ == "__main__":
    main()
