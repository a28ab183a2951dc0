"""Errors a caller sees: ``ActorError`` (an endpoint raised) and ``SupervisionError``."""

from __future__ import annotations

from typing import Any

REMOTE_TRACEBACK_HEADER = "Traceback of where the remote call failed (most recent call last):"


def format_remote_exception(exc: BaseException) -> str:
    """The traceback text of ``exc`` (with chained causes) as shown to the remote caller."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text.replace("Traceback (most recent call last):", REMOTE_TRACEBACK_HEADER)


def add_note(exc: BaseException, note: str) -> None:
    """Add ``note`` (what was being done, a HINT) below ``exc``'s message in its traceback
    (Python 3.11's exception notes; on 3.10 it is kept in ``__notes__`` and not shown)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]


class ActorError(Exception):
    """An endpoint raised; ``.exception`` is the original exception, the actor is still alive."""

    def __init__(
        self,
        exception: BaseException,
        message: str = "A remote actor call has failed.",
        exception_formatted: str | None = None,
    ) -> None:
        self.exception = exception
        self.message = message
        self.exception_formatted = (
            exception_formatted if exception_formatted is not None else format_remote_exception(exception)
        )
        super().__init__(f"{message}\n {self.exception_formatted}")

    def __reduce__(self) -> Any:
        # The original exception travels as its own pickle, so that an exception the caller
        # cannot rebuild (unknown class, unusual __init__) still arrives as an ActorError.
        from monarch._src.wire import payload

        try:
            inner = payload.dumps_inband(self.exception)
        except Exception:
            inner = b""
        return (_rebuild_actor_error, (inner, self.message, self.exception_formatted))

    def __str__(self) -> str:
        return f"{self.message}\n {self.exception_formatted}"


def _rebuild_actor_error(inner: bytes, message: str, formatted: str) -> ActorError:
    from monarch._src.wire import payload

    try:
        exception = payload.loads(inner)
    except Exception as e:
        last = formatted.strip().splitlines()[-1] if formatted.strip() else "unknown error"
        exception = RemoteExceptionPlaceholder(f"{last} (the exception could not be rebuilt here: {e})")
    return ActorError(exception, message, formatted)


class SupervisionError(RuntimeError):
    """The actor (or its process) that a call depends on has failed or was stopped."""


class RemoteExceptionPlaceholder(Exception):
    """Stands in for an exception that could not be pickled on the remote side."""
