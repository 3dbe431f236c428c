"""The accuracy contract lives in ``dispatch/accuracy.py`` (a contract type, below autograd and
the ops); re-exported here for the ops' imports."""

from __future__ import annotations

from ..dispatch.accuracy import *  # noqa: F401,F403
from ..dispatch.accuracy import __all__  # noqa: F401
