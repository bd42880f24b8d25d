"""Typed argument checks, public for ``spmd`` and ``fsdp_xla`` (and anyone writing a checker in
the same style): each ``require_*`` takes the value, the parameter's name as the message should
show it and the caller's error class, and raises that class with one message that names the
parameter, shows the value (bounded) and says what is allowed; each returns the value normalised.

`is_int` and `is_real` are the one place the bool-is-not-a-number rule is written; `shape_arg`
checks a mesh shape argument, and `summarize_ids` bounds a list of device ids for a message.
The implementation lives in ``mesh._checks`` and ``mesh._mesh`` (private).
"""

from mesh._checks import is_int as is_int
from mesh._checks import is_real as is_real
from mesh._checks import require_bool as require_bool
from mesh._checks import require_int as require_int
from mesh._checks import require_optional_bool as require_optional_bool
from mesh._checks import require_real as require_real
from mesh._checks import require_str as require_str
from mesh._checks import shown as shown
from mesh._mesh import shape_arg as shape_arg
from mesh._mesh import summarize_ids as summarize_ids

__all__ = [
    "is_int",
    "is_real",
    "require_bool",
    "require_int",
    "require_optional_bool",
    "require_real",
    "require_str",
    "shape_arg",
    "shown",
    "summarize_ids",
]
