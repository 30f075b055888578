"""Secret arguments: marked on the tool, redacted everywhere, sealed on the wire.

Mark a parameter secret with ``Annotated[str, Secret]`` (the tool gets a ``str``) or
pydantic's ``SecretStr`` (the tool gets a ``SecretStr``; ``.get_secret_value()``),
optionally ``| None``. Secrets are top-level parameters: a secret nested in a model or
a list is refused when the tool is defined.

What happens to a secret:

* Everything that shows a call shows ``"**********"`` in its place: the engine's run
  events and approvals (so the Flask and Django pages and JSON), Celery's task events
  and logs (the task's ``argsrepr``/``kwargsrepr``), and the idempotency key function.
* In the message, and so in the store's spec that recovery republishes, the value is
  *sealed*: ``{"aaa_sealed": "<Fernet token>"}``, encrypted with the Celery setting
  ``aaa_secret_key`` (a Fernet key; a list of keys to rotate them, the first one
  encrypts). The worker unseals it just before the tool runs. So the broker, the
  store and recovery only ever hold ciphertext, and a republished call still carries
  its secret. Every app that sends calls and every worker needs the same key;
  ``bind()`` refuses a handler with secret tools on an app without one (the embedded
  engine, on the in-memory broker, makes a key of its own for the process).
* A call that reaches a worker with a secret in clear (sent around ``apply_async``,
  e.g. by ``send_task``) is refused with a ``ToolArgsError``: its clear value may
  already sit in the store's spec.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, TypeGuard, Union

from pydantic import BaseModel, SecretStr

from ..errors import ConfigError, ToolArgsError
from ..worker.setting_names import spelled

#: What stands in for a secret wherever a call is shown.
REDACTED = "**********"
#: The key of a sealed secret in a message: ``{"aaa_sealed": token}``.
SEALED = "aaa_sealed"
#: The Celery setting that holds the Fernet key (or keys) of sealed secrets.
KEY_SETTING = "aaa_secret_key"


class Secret:
    """Marks a ``str`` parameter secret: ``password: Annotated[str, Secret]``.

    The tool receives the value intact; everything else sees ``"**********"``.
    """


def _marked(meta: Any) -> bool:
    return meta is Secret or isinstance(meta, Secret)


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return rest[0] if len(rest) == 1 else tp
    return tp


def _secret_kind(tp: Any) -> bool:
    """Whether a parameter's annotation makes it secret (``str`` or ``SecretStr``, maybe optional)."""
    tp = _strip_optional(tp)
    if typing.get_origin(tp) is Annotated:
        base, *meta = typing.get_args(tp)
        if any(_marked(m) for m in meta):
            if _strip_optional(base) not in (str, SecretStr):
                raise ConfigError(f"Secret marks a str parameter: Annotated[str, Secret], not {tp!r}")
            return True
        return _secret_kind(base)
    return tp is SecretStr


def _nested_secret(tp: Any, seen: set[int]) -> bool:
    """Whether a secret hides anywhere inside ``tp`` (a model's fields, a container's items)."""
    if tp is SecretStr:
        return True
    if id(tp) in seen:
        return False
    seen.add(id(tp))
    if typing.get_origin(tp) is Annotated and any(_marked(m) for m in typing.get_args(tp)[1:]):
        return True
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return any(
            f.annotation is not None and (_nested_secret(f.annotation, seen) or any(_marked(m) for m in f.metadata))
            for f in tp.model_fields.values()
        )
    return any(_nested_secret(a, seen) for a in typing.get_args(tp) if not isinstance(a, str | int | float | bool))


def secret_params(name: str, hints: dict[str, Any], params: list[str]) -> frozenset[str]:
    """The secret parameters among ``params`` (``hints`` with their ``Annotated`` extras);
    a secret anywhere deeper is refused."""
    found = set()
    for p in params:
        tp = hints.get(p, Any)
        if _secret_kind(tp):
            found.add(p)
        elif _nested_secret(tp, set()):
            raise ConfigError(
                f"tool {name!r}: parameter {p!r} holds a secret inside it; make each secret a parameter "
                f"of its own (password: Annotated[str, Secret] or SecretStr)"
            )
    return frozenset(found)


def clear_value(value: Any) -> str:
    """A validated secret's clear text."""
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def without_secrets(arguments: Any, secrets: frozenset[str], fields: frozenset[str]) -> Any:
    """A model's raw ``arguments`` with nothing that may hold a secret: what the digest in a
    call id is made of. Each secret parameter, and any key that is no parameter (a
    misspelt secret is no secret to the schema), stands as ``"**********"``; arguments that
    are not an object become their type's name. A tool without secrets keeps its
    arguments as they are (so the ids of its calls are those of earlier releases)."""
    if not secrets:
        return arguments
    if not isinstance(arguments, dict):
        return f"<{type(arguments).__name__}>"
    return {k: REDACTED if k in secrets or k not in fields else v for k, v in arguments.items()}


def is_sealed(value: Any) -> TypeGuard[dict[str, str]]:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(SEALED), str)


class Sealer:
    """Seals and unseals secret values with Fernet keys (the first key seals)."""

    def __init__(self, keys: str | bytes | list[str | bytes] | tuple[str | bytes, ...]) -> None:
        try:
            from cryptography.fernet import Fernet, MultiFernet
        except ImportError:  # pragma: no cover - depends on the install
            raise ConfigError(
                "secret tool arguments need the cryptography package: pip install 'aaa_celery[secrets]'"
            ) from None
        listed = [keys] if isinstance(keys, str | bytes) else list(keys)
        try:
            self._fernet = MultiFernet([Fernet(k) for k in listed])
        except (ValueError, TypeError) as e:
            raise ConfigError(
                f"{KEY_SETTING}: not a Fernet key ({e}); make one with "
                "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
            ) from None

    @classmethod
    def generate(cls) -> Sealer:
        from cryptography.fernet import Fernet

        return cls(Fernet.generate_key())

    def seal(self, clear: str) -> dict[str, str]:
        return {SEALED: self._fernet.encrypt(clear.encode("utf-8")).decode("ascii")}

    def unseal(self, sealed: dict[str, str]) -> str:
        from cryptography.fernet import InvalidToken

        try:
            return self._fernet.decrypt(sealed[SEALED].encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError, ValueError):
            raise ToolArgsError(f"a sealed secret that no key of {KEY_SETTING} opens") from None


def sealer_for(app: Any) -> Sealer | None:
    """The app's sealer: from its ``aaa_secret_key`` setting; on the in-memory broker, a
    key of this process's own; else None (no key: secret tools cannot be sent)."""
    sealer: Sealer | None = getattr(app, "_aaa_sealer", None)
    if sealer is not None:
        return sealer
    keys = app.conf.get(KEY_SETTING)
    if keys:
        sealer = Sealer(keys)
    elif str(app.conf.broker_url or "").startswith("memory://"):
        sealer = Sealer.generate()  # the broker, the store and the worker live in this process
    else:
        return None
    app._aaa_sealer = sealer
    return sealer


def require_sealer(app: Any, tool_name: str, secrets: frozenset[str]) -> Sealer:
    sealer = sealer_for(app)
    if sealer is None:
        raise ConfigError(
            f"tool {tool_name!r} has secret arguments ({', '.join(sorted(secrets))}): set the Celery setting "
            f"{spelled(app, KEY_SETTING)} to a Fernet key, the same on every worker and every app that sends calls "
            "(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
        )
    return sealer


def seal(arguments: dict[str, Any], secrets: frozenset[str], sealer: Sealer) -> dict[str, Any]:
    """``arguments`` (canonical, secrets in clear) with each secret sealed."""
    out = dict(arguments)
    for field in secrets:
        if isinstance(out.get(field), str):
            out[field] = sealer.seal(out[field])
    return out


def unseal(name: str, arguments: Any, secrets: frozenset[str], sealer: Sealer | None,
           allow_clear: bool = False) -> Any:
    """``arguments`` with each sealed secret opened. A secret in clear is refused (unless
    ``allow_clear``: a direct call, or a send that seals it next)."""
    if not secrets or not isinstance(arguments, dict):
        return arguments
    out = dict(arguments)
    for field in secrets:
        value = out.get(field)
        if is_sealed(value):
            if sealer is None:
                raise ToolArgsError(f"{name}: {field}: a sealed secret, and no {KEY_SETTING} to open it")
            try:
                out[field] = sealer.unseal(value)
            except ToolArgsError as e:
                raise ToolArgsError(f"{name}: {field}: {e}") from None
        elif value is not None and not allow_clear and field in out:
            raise ToolArgsError(
                f"{name}: {field}: a secret that arrived in clear; send the call with delay()/apply_async(), "
                "which seal it"
            )
    return out


def seal_raw(arguments: Any, secrets: frozenset[str], sealer: Sealer) -> Any:
    """A model's raw arguments to keep (a recorded model turn), each secret sealed; a secret
    that is not a string (the call is refused anyway) is redacted."""
    if not secrets or not isinstance(arguments, dict):
        return arguments
    return {k: (v if k not in secrets or v is None else sealer.seal(v) if isinstance(v, str) else REDACTED)
            for k, v in arguments.items()}


def open_raw(arguments: Any, secrets: frozenset[str], sealer: Sealer | None) -> Any:
    """:func:`seal_raw`'s arguments as the model sent them (a secret no key opens is redacted)."""
    if not secrets or not isinstance(arguments, dict):
        return arguments
    out = dict(arguments)
    for k in secrets & out.keys():
        if is_sealed(out[k]):
            try:
                out[k] = sealer.unseal(out[k]) if sealer is not None else REDACTED
            except ToolArgsError:
                out[k] = REDACTED
    return out


__all__ = [
    "KEY_SETTING", "REDACTED", "SEALED", "Sealer", "Secret", "clear_value", "is_sealed",
    "open_raw", "require_sealer", "seal", "seal_raw", "sealer_for", "secret_params", "unseal",
]
