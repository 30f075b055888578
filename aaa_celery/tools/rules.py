"""Where a ``ToolHandler``'s guard policy (:mod:`aaa_celery.policy`) is enforced.

* :func:`judge_send`: when a tool's task is sent (``apply_async``: the engine, a
  ``ToolTaskHandle``, a canvas), before anything is stored or published. Access rules and
  argument constraints only; a refused call raises ``PolicyDenied`` to the sender (the
  engine turns it into the call's failed fact).
* :func:`judge_delivery`: in the worker, before the guard claims an attempt. Every rule,
  counting the rate limits and budgets in the store, once per call. A refused call's one
  outcome becomes that ``PolicyDenied`` (store and result backend), and no attempt is taken.

Rules judge the arguments as the tool's schema validates them (``"0100"`` for an ``int``
is 100). Arguments that do not validate are left to the tool, which fails the call with a
``ToolArgsError`` without running.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Reject

from ..errors import ConfigError, InvalidId, PolicyDenied, StoreError, ToolArgsError
from ..lifecycle import Slot
from ..policy import Budget, Where, admit, check, concurrency_rule, parse_check
from ..protocol import RUN_HEADER, TENANT_HEADER, check_call, tenant_of
from ..worker import app_store
from ..worker.settle import settle_refused


def _polices(policy: Any) -> bool:
    return bool(policy.rules or policy.denied_tools or policy.default_access != "allow")


def _validated(task: Any, args: Any, kwargs: Any) -> dict[str, Any] | None:
    """The delivery's arguments, checked and canonical (secrets unsealed), or None."""
    try:
        return task.checked(args, kwargs).canonical  # type: ignore[no-any-return]
    except ToolArgsError:
        return None


def judge_send(task: Any, arguments: dict[str, Any], task_id: str | None) -> None:
    """Raise ``PolicyDenied`` if the policy's access rules or argument constraints refuse
    this call of ``task`` (a ``ToolTask``) as it is sent; ``arguments`` are checked already."""
    policy = type(task).policy
    if _polices(policy):
        check(policy, type(task).tool.name, tenant_of(task_id) if task_id else None, arguments)


def judge_delivery(task: Any, args: Any, kwargs: Any) -> None:
    """Judge the delivery being run by every rule of the policy, before an attempt is
    claimed. A refused call is recorded (no attempt) and ``PolicyDenied`` raised; a call
    that has an outcome already goes on, and the guard answers with that outcome."""
    policy, req = type(task).policy, task.request
    if not _polices(policy):
        return
    try:
        identity = check_call(req.id, getattr(req, TENANT_HEADER, None), getattr(req, RUN_HEADER, None))
    except InvalidId:
        return  # the guard drops a message that names another tenant, writing nothing
    arguments = _validated(task, args, kwargs)
    if arguments is None:
        return
    store = app_store(task.app)
    try:
        if store.result(req.id) is not None:
            return  # a redelivery of a finished call: the guard answers with its outcome, nothing counts
        admit(policy, type(task).tool.name, identity.tenant if identity else None, arguments, req.id, store.spend)
    except PolicyDenied as denied:
        try:
            recorded = settle_refused(task.app, task, req.id, denied)
        except StoreError as e:
            raise _hand_back(e) from None
        if recorded:
            raise
        # the call got an outcome meanwhile: the guard answers with it
    except StoreError as e:
        raise _hand_back(e) from None


def slot_for(task: Any, tenant: str | None, args: Any, kwargs: Any) -> Slot | None:
    """The slot a delivery of ``task`` (a ``ToolTask``) holds to run: its policy's first
    ``Concurrency`` rule for the tool and ``tenant``, keyed by the checked arguments; None
    without one, or for arguments that do not validate (the tool fails them without running).
    Raises ``PolicyDenied`` for a call whose key cannot be made."""
    tool = type(task).tool.name
    rule = concurrency_rule(type(task).policy, tool, tenant)
    if rule is None:
        return None
    arguments = _validated(task, args, kwargs)
    if arguments is None:
        return None
    return Slot(rule.slot_key(tool, tenant, arguments), rule.limit, rule.on_busy, rule.label)


def _hand_back(error: StoreError) -> Reject:
    """Never run a call the policy could not judge: the message goes back to the broker."""
    return Reject(f"aaa store unavailable while judging the guard policy: {error}", requeue=True)


def refuse_secret_paths(policy: Any, tool: str, secrets: frozenset[str]) -> None:
    """Refuse a ``Where`` or ``Budget`` rule of ``tool`` that reads a secret argument: a
    denial quotes the value it checked, and a budget keeps its ``by`` values in its store
    key, so the secret would reach the store, the logs and the model in clear."""
    if not secrets:
        return
    for rule in policy.rules:
        if not rule.covers(tool):
            continue
        if isinstance(rule, Where):
            paths = [parse_check(rule.check)[0]]
        elif isinstance(rule, Budget):
            paths = [rule.amount, *rule.by]
        else:
            continue
        for path in paths:
            if path.split(".", 1)[0] in secrets:
                raise ConfigError(
                    f"guards: rule {rule.label!r} reads {path!r}, a secret argument of tool {tool!r}: its "
                    f"denials and budget keys would hold the secret in clear; check it inside the tool instead"
                )
