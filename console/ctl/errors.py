"""Why ``gpurouter ctl`` stopped, each with the exit code a script can rely on.

    CtlError (GpuRouterError)  base: one line for stderr and an exit code
    ├── RefusedError         1  the router refused the command (HTTP 409)
    ├── BadValueError        2  a value ctl or the router could not accept (HTTP 400)
    ├── UnreachableError     3  no admin API answered: refused, timed out, or something else did
    └── AuthFailedError      4  the admin API wants a token, or refused the one given (401/403)

Argparse's own usage errors exit 2 as well, with the same ``gpurouter ctl: error:`` prefix.
"""

from __future__ import annotations

from typing import ClassVar

from router.errors import GpuRouterError

__all__ = ["AuthFailedError", "BadValueError", "CtlError", "RefusedError", "UnreachableError"]


class CtlError(GpuRouterError):
    """A failure of one ``ctl`` invocation, rendered as one line on stderr."""

    exit_code: ClassVar[int] = 1

    def __str__(self) -> str:
        # One line, whatever the router's message held.
        return " ".join(super().__str__().split())


class RefusedError(CtlError):
    """The router understood the command and refused it (wrong state, unknown replica...)."""

    exit_code = 1


class BadValueError(CtlError):
    """A value was not acceptable: an option ctl checks, or a command the router could not read."""

    exit_code = 2


class UnreachableError(CtlError):
    """The admin API could not be reached, or what answered was not the admin API."""

    exit_code = 3


class AuthFailedError(CtlError):
    """No token was given where one is needed, or the token was wrong."""

    exit_code = 4
