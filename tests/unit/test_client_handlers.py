"""The client's input handlers, without a server: which request each answers, what it declares, and the clear
errors for a request no handler can answer (a server that asks although the capability was not declared) or
one the server malformed."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_lossless.client import InputUnanswered, ProtocolViolation
from mcp_lossless.client.handlers import answer_input, capabilities, checked

pytestmark = pytest.mark.anyio


async def roots(params: dict[str, Any]) -> dict[str, Any]:
    return {"roots": [{"uri": "file:///work", "name": str(params.get("n"))}]}


async def test_each_request_goes_to_its_method_handler_and_a_given_key_is_not_asked_again() -> None:
    asked: list[dict[str, Any]] = []

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return {"action": "decline"}

    handlers = checked({"roots/list": roots, "elicitation/create": elicit})
    assert capabilities(handlers) == {"roots": {}, "elicitation": {}}
    requests = {
        "a": {"method": "roots/list", "params": {"n": 1}},
        "b": {"method": "elicitation/create", "params": {"message": "ok?"}},
        "c": {"method": "elicitation/create", "params": {"message": "again?"}},
    }
    got = await answer_input(handlers, requests, "t", given={"c": {"action": "accept"}})
    assert got == {
        "a": {"roots": [{"uri": "file:///work", "name": "1"}]},
        "b": {"action": "decline"},
        "c": {"action": "accept"},
    }
    assert asked == [{"message": "ok?"}], "the key already answered was not put to the user again"


async def test_a_request_without_a_handler_or_malformed_is_a_clear_error() -> None:
    handlers = checked({"roots/list": roots})
    with pytest.raises(InputUnanswered, match=r"book asks for sampling/createMessage \(input 'k'\)"):
        await answer_input(handlers, {"k": {"method": "sampling/createMessage", "params": {}}}, "book")
    for malformed in (
        {},
        [],
        {"k": "roots/list"},
        {"k": {"method": 3, "params": {}}},
        {"k": {"method": "x", "params": 1}},
    ):
        with pytest.raises(ProtocolViolation):
            await answer_input(handlers, malformed, "book")

    async def odd(params: dict[str, Any]) -> Any:
        return ["not", "an", "object"]

    with pytest.raises(InputUnanswered, match="returned list"):
        await answer_input(checked({"roots/list": odd}), {"k": {"method": "roots/list", "params": {}}}, "book")
    with pytest.raises(ValueError, match="ping"):
        checked({"ping": roots})
