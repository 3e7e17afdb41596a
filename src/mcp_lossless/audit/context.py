"""What every check shares: the target, the call to use, tokens by resource set, fresh sessions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import protocol
from .tokens import Tokens, TokenUnavailable, audience
from .wire import Credential, Exchange, HandshakeFailed, Wire, WireSession, all_answered, call_message

DEFAULT_VERSION = protocol.LATEST
BATCH_VERSION = protocol.BATCHING
CALL_FAILED = "the call failed with the wide token (does it cover the call? see --resource)"


class NotRun(Exception):
    """A check could not reach a verdict; the reason (and any exchanges so far) go into the report."""

    def __init__(self, reason: str, evidence: Sequence[Exchange] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.evidence = list(evidence)


@dataclass(frozen=True, slots=True)
class AuditCall:
    """The operator's "wide" call: one that sends several progress notifications over some time."""

    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AuditSettings:
    url: str
    call: AuditCall
    narrow_resources: tuple[str, ...] = ()
    """A resource set that does NOT cover the call (e.g. another tool's indicator)."""
    foreign_resource: str = "https://not-this-server.example/mcp"
    tool_resources: dict[str, str] = field(default_factory=dict)
    """Resource indicator per tool given on the command line; ``tools/list`` ``_meta`` is used otherwise."""
    version: str = DEFAULT_VERSION
    read_seconds: float = 10.0
    """Longest the audit waits on any one stream."""
    open_seconds: float = 5.0
    """How long a resumed, completed stream may stay open before it counts as never ending."""
    allow_not_run: bool = False
    """Exit 0 even when a check could not run (else 3: a misconfigured audit must not pass for a clean one)."""


@dataclass(slots=True)
class Sent:
    """A tools/call the audit sent: its JSON-RPC id and progress token identify everything it produced."""

    request_id: int
    progress_token: str
    message: dict[str, Any]

    def owns(self, message: dict[str, Any]) -> bool:
        """Whether ``message`` is a progress notification or the result/error of this call."""
        if message.get("method") == "notifications/progress":
            params = message.get("params")
            return isinstance(params, dict) and params.get("progressToken") == self.progress_token
        return message.get("id") == self.request_id and ("result" in message or "error" in message)

    def leaked_in(self, exchange: Exchange) -> list[dict[str, Any]]:
        """This call's progress and *results* in ``exchange`` (an error answer is a refusal, not a leak)."""
        return [m for m in exchange.messages() if self.owns(m) and "error" not in m]


class Audit:
    """The state of one audit run that checks draw on."""

    def __init__(
        self,
        wire: Wire,
        settings: AuditSettings,
        resource: str,
        principal: Tokens | None,
        second: Tokens | None,
    ) -> None:
        self.wire = wire
        self.settings = settings
        self.resource = resource
        """The call's resource indicator (R1)."""
        self.principal = principal
        self.second = second
        self.memo: dict[str, Any] = {}
        """Experiments whose exchanges several checks read (e.g. the narrowed resume)."""

    async def once(self, key: str, make: Callable[[Audit], Awaitable[Any]]) -> Any:
        """Run an experiment once per audit; a reason it could not run holds for every check that needs it."""
        if key not in self.memo:
            try:
                self.memo[key] = await make(self)
            except NotRun as exc:
                self.memo[key] = exc
        outcome = self.memo[key]
        if isinstance(outcome, NotRun):
            raise outcome
        return outcome

    @property
    def wide_resources(self) -> tuple[str, ...]:
        """The call's resource plus the narrow set: narrowing it to the narrow set is a plain refresh."""
        return tuple(dict.fromkeys((self.resource, *self.settings.narrow_resources)))

    async def wide(self) -> Credential | None:
        """The first principal's token covering the call; ``None`` when the server is audited without tokens."""
        if self.principal is None:
            return None
        return await self.principal.credential(self.wide_resources, "wide")

    async def narrowed(self) -> Credential:
        if not self.settings.narrow_resources:
            raise NotRun("no --narrow-resource given: a narrowed token needs a resource set without the call's")
        if self.principal is None:
            raise NotRun("no token source: narrowing needs --token-endpoint or --token-command")
        try:
            narrowed = await self.principal.credential(self.settings.narrow_resources, "narrowed")
        except TokenUnavailable as exc:
            raise NotRun(f"no narrowed token: {exc}") from None
        wide = await self.wide()
        minted = audience(narrowed.token)
        if (wide is not None and wide.token == narrowed.token) or (minted is not None and self.resource in minted):
            raise NotRun("the token source ignored the narrowed resources: the narrowed token still covers the call")
        return narrowed

    async def session(self, label: str, credential: Credential | None = None) -> WireSession:
        """A fresh session, opened with ``credential`` or else the wide token."""
        try:
            return await self.wire.open_session(
                credential if credential is not None else await self.wide(), self.settings.version, label
            )
        except HandshakeFailed as exc:
            raise NotRun(f"could not open a session ({exc})", [exc.exchange]) from None

    def new_call(self) -> Sent:
        request_id, token = self.wire.next_id(), self.wire.progress_token()
        call = self.settings.call
        return Sent(request_id, token, call_message(request_id, call.tool, call.arguments, token))

    async def complete_call(self, session: WireSession, label: str) -> tuple[Sent, Exchange]:
        """Run the call to its answer, reading everything; it must be resumable (its events carry ids)."""
        sent = self.new_call()
        exchange = await self.wire.post(session, sent.message, label=label, stop=all_answered(sent.request_id))
        answer = exchange.terminal_for(sent.request_id)
        if answer is None:
            raise NotRun(f"the call got no answer (HTTP {exchange.status}, stream {exchange.end})", [exchange])
        if (failure := failure_of(answer)) is not None:
            raise NotRun(f"{CALL_FAILED}: {failure}", [exchange])
        if exchange.last_event_id is None:
            raise NotRun("the call's stream carried no event ids: the server offers no resumption", [exchange])
        return sent, exchange


def failure_of(answer: dict[str, Any]) -> str | None:
    """What went wrong, when a call's answer is a JSON-RPC error or a tool error (``isError``)."""
    if "error" in answer:
        return f"JSON-RPC error {answer['error']}"
    result = answer.get("result")
    if not isinstance(result, dict):
        return f"malformed result {result!r}"
    if result.get("isError"):
        return f"tool error {result.get('content')}"
    return None
