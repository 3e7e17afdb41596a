"""The client session handles every action the ledger can return: none is dropped without a word.

``mypy --strict`` already rejects an unhandled action (``Session._apply`` ends in ``assert_never``); this test
says the same in the test run, by reading the ``case`` patterns of ``_apply`` and comparing them with the
members of the :data:`~mcp_lossless.core.actions.Action` union. Its checker is tested on planted sources.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing

from mcp_lossless.client.session import Session
from mcp_lossless.core.actions import Action


def matched_classes(source: str) -> set[str]:
    """Class names matched by the patterns of every ``match`` statement in ``source``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.MatchClass) and isinstance(node.cls, ast.Name):
            names.add(node.cls.id)
    return names


def unhandled(source: str, members: set[str]) -> set[str]:
    return members - matched_classes(source)


ACTIONS = {member.__name__ for member in typing.get_args(Action)}


def test_the_action_union_has_members() -> None:
    assert {"SendCall", "Resume", "Resolve", "Report"} <= ACTIONS


def test_session_apply_has_a_case_for_every_action() -> None:
    source = inspect.getsource(Session._apply)
    assert unhandled(source, ACTIONS) == set()
    assert "assert_never(action)" in source, "the last case must make the match exhaustive for mypy"


def test_the_checker_finds_a_missing_case() -> None:
    planted = """
        def _apply(actions):
            for action in actions:
                match action:
                    case SendCall() | SendBatch():
                        pass
                    case Resume():
                        pass
                    case _:
                        assert_never(action)
    """
    assert unhandled(planted, {"SendCall", "SendBatch", "Resume", "Report"}) == {"Report"}


def test_the_checker_does_not_count_an_isinstance_test_as_a_case() -> None:
    planted = """
        def _apply(actions):
            for action in actions:
                if isinstance(action, Report):
                    pass
    """
    assert unhandled(planted, {"Report"}) == {"Report"}
