"""What the server's types promise about its seams, checked where mypy cannot see a broken promise.

``_deny`` always raises: typed ``NoReturn``, the type checker narrows what follows it (no ``assert`` to say what
the denial left). Every server has a 2026-07-28 leg (``create_app`` always builds one): the request path and the
app's lifespan take it as given instead of checking a ``None`` that never comes.
"""

from __future__ import annotations

import inspect
import typing
from typing import NoReturn

from mcp_lossless.server.app import LosslessApp
from mcp_lossless.server.modern import ModernLeg
from mcp_lossless.server.modern.tasks import Tasks
from mcp_lossless.server.transport import Transport


def test_a_task_denial_is_typed_as_always_raising() -> None:
    assert typing.get_type_hints(Tasks.deny)["return"] is NoReturn


def test_the_modern_leg_is_required_where_every_server_has_one() -> None:
    for built in (Transport.__init__, LosslessApp.__init__):
        parameter = inspect.signature(built).parameters["modern"]
        assert parameter.default is inspect.Parameter.empty, built.__qualname__
        assert typing.get_type_hints(built)["modern"] is ModernLeg, built.__qualname__
