"""``gpurouter ctl``'s parts: the admin API client, its errors and what it prints.

The command itself (arguments, dispatch) is ``console/ctl_command.py``.
"""

from console.ctl.client import AdminClient
from console.ctl.errors import (
    AuthFailedError,
    BadValueError,
    CtlError,
    RefusedError,
    UnreachableError,
)

__all__ = [
    "AdminClient",
    "AuthFailedError",
    "BadValueError",
    "CtlError",
    "RefusedError",
    "UnreachableError",
]
