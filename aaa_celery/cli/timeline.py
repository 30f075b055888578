"""A call's story, attempt by attempt, from its audit trail (``celery aaa show``)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from ..lifecycle import (
    COMPLETED,
    FAILED,
    FENCED,
    IN_DOUBT,
    RECONCILED,
    RESOLVED,
    RETRIED,
    STALE_RESULT,
    STARTED,
    Event,
    Outcome,
)

#: What ended an attempt, by the event that says so.
_ENDINGS = {COMPLETED: "completed", FAILED: "failed", FENCED: "fenced", STALE_RESULT: "stale result",
            RETRIED: "handed on (retry)"}


def when(at: float | None) -> str:
    """A store time as ISO 8601 UTC with milliseconds."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _holder(worker: str) -> tuple[str, int | None]:
    """``host/pid/thread`` (the guard's holder name) as (host, pid)."""
    host, _, rest = worker.partition("/")
    pid = rest.partition("/")[0]
    return host, int(pid) if pid.isdigit() else None


def holder_label(worker: str | None) -> str:
    """A holder as an operator reads it: ``w2@vm pid 30913`` (the thread's ident, which the
    holder name carries to tell a thread pool's calls apart, says nothing to a person)."""
    if not worker:
        return ""
    host, pid = _holder(worker)
    return f"{host} pid {pid}" if pid is not None else worker


def timeline(call_id: str, events: list[Event], result: Outcome | None) -> dict[str, Any]:
    """The call as JSON data: its attempts (worker, pid, start, end, fence and how each
    ended), lease events, result, fenced and stale results, and resolutions."""
    attempts: dict[int, dict[str, Any]] = {}
    lease_events, stale, resolutions, reconciliations = [], [], [], []
    name = ""
    for e in events:
        name = name or str(e.data.get("name") or "")
        if e.type == STARTED:
            worker = str(e.data.get("worker") or "")
            host, pid = _holder(worker)
            attempts[e.attempt] = {"attempt": e.attempt, "fence": e.attempt, "worker": host, "holder": worker,
                                   "pid": pid, "start": e.at, "end": None, "ended": "running or lost"}
        elif e.type == RESOLVED:
            resolutions.append({"at": e.at, **e.data})
            continue
        elif e.type == RECONCILED:
            reconciliations.append({"at": e.at, "attempt": e.attempt, **e.data})
            continue
        if e.type in (FENCED, RETRIED):
            lease_events.append({"at": e.at, "type": e.type, "attempt": e.attempt})
        if e.type == STALE_RESULT:
            stale.append({"at": e.at, "attempt": e.attempt,
                          **{k: v for k, v in e.data.items() if k in ("value", "error", "message")}})
        attempt = attempts.get(e.attempt)
        if e.type in _ENDINGS and attempt is not None and attempt["end"] is None:
            attempt["end"], attempt["ended"] = e.at, _ENDINGS[e.type]
            if e.type == FAILED and e.data.get("error") in IN_DOUBT:  # refused after the attempt was lost
                attempt["ended"] = f"lost ({e.data['error']})"
    ordered = [attempts[n] for n in sorted(attempts)]
    for this, following in itertools.pairwise(ordered):
        if this["end"] is None:  # lost: its worker died or stalled, and attempt n+1 took over
            this["ended"] = f"lost (taken over by attempt {following['attempt']})"
    if ordered and ordered[-1]["end"] is None and result is not None and not result.ok:
        ordered[-1]["ended"] = f"lost ({result.error})"
    return {
        "call_id": call_id,
        "name": name,
        "state": _state(result, ordered, resolutions),
        "attempts": ordered,
        "lease_events": lease_events,
        "result": None if result is None else result.__dict__,
        "stale_results": stale,
        "resolutions": resolutions,
        "reconciliations": reconciliations,
        "events": [e.__dict__ for e in events],
    }


def _state(result: Outcome | None, attempts: list[dict[str, Any]], resolutions: list[Any]) -> str:
    if result is None:
        return "running or pending" if attempts else "pending"
    if resolutions:
        return f"resolved as {resolutions[-1].get('as')}"
    if result.ok:
        return "completed"
    return {"OutcomeUnknown": "unknown", "ExecutionAbandoned": "abandoned",
            "TaskRevokedError": "revoked"}.get(result.error or "", "failed")


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    """Plain aligned columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), *(fmt.format(*map(str, r)).rstrip() for r in rows)]


def render(story: dict[str, Any]) -> str:
    """The human form of :func:`timeline`."""
    lines = [f"call {story['call_id']}  tool {story['name'] or '-'}  state {story['state']}", ""]
    rows = [[a["attempt"], a["fence"], a["worker"] or "-", a["pid"] or "-", when(a["start"]), when(a["end"]),
             a["ended"]] for a in story["attempts"]]
    lines += table(rows, ["attempt", "fence", "worker", "pid", "start", "end", "ended"]) if rows else ["no attempt"]
    if any(a["ended"].startswith("lost") for a in story["attempts"]):
        lines.append("(a lost attempt's end is when the store found its lease lapsed, not when its worker stopped)")
    for e in story["lease_events"]:
        lines.append(f"lease: {when(e['at'])} {e['type']} (attempt {e['attempt']})")
    for s in story["stale_results"]:
        what = s.get("error") or f"value {s.get('value')!r}"
        lines.append(f"stale result: {when(s['at'])} from attempt {s['attempt']}: {what} (audit only)")
    result = story["result"]
    resolution = story["resolutions"][-1] if story["resolutions"] else None
    if result is None:
        lines.append("result: none yet")
    elif resolution is not None:  # the operator's verdict, not an attempt's result
        answer = f"{result['value']!r}" if result["ok"] else f"{result['error']}: {result['message']}"
        lines.append(f"result: resolved as {resolution.get('as')} by {resolution.get('by')}: {answer}")
    elif result["ok"]:
        lines.append(f"result: completed by attempt {result['attempt']}: {result['value']!r}")
    else:
        lines.append(f"result: {result['error']}: {result['message']}")
    for r in story["reconciliations"]:
        said = {"happened": f"the effect happened: {r.get('value')!r}", "not_happened": "the effect did not happen",
                "unknown": "the called system could not tell", "error": f"the reconcile step failed: {r.get('error')}"}
        lines.append(f"reconciled: {when(r['at'])} {said.get(r.get('found'), r.get('found'))}")
    for r in story["resolutions"]:
        lines.append(f"resolved: {when(r['at'])} as {r['as']} by {r['by']}: {r['note']}")
    return "\n".join(lines)
