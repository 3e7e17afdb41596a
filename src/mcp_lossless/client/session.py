"""The client engine: runs the ledger's decisions over HTTP, one task per connection.

Every ledger input happens on the event loop between awaits, so the ledger needs no lock. Each stream's
current connection (or its pending reconnect) runs inside a cancel scope that ``CloseStream`` cancels;
the ledger ignores anything a superseded connection still reports.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, assert_never
from urllib.parse import urlsplit

import anyio
import httpx
import orjson
from anyio.abc import TaskGroup

from .. import __version__
from ..core import errors as codes
from ..core import protocol
from ..core.actions import (
    Action,
    Answered,
    CallKey,
    CallOutcome,
    CallSpec,
    CancelOnServer,
    CloseStream,
    Failure,
    FailureKind,
    Incoming,
    Link,
    Progress,
    Reauthorize,
    RecoveryPolicy,
    Report,
    Resolve,
    Resume,
    SendBatch,
    SendCall,
    StreamKey,
)
from ..core.denials import remedy
from ..core.ledger import Ledger
from ..core.sse import SseTooLarge
from .errors import (
    AuthorizationFailed,
    CallMayHaveRun,
    ClientClosed,
    ConnectionFailed,
    DeadlineExceeded,
    McpClientError,
    ProtocolViolation,
    RemoteError,
    RequestRejected,
    SessionLost,
    describe_failure,
    unreachable,
)
from .handlers import InputHandler, InputRefused, answer_input, checked, for_call, offered
from .oauth import Auth, parse_challenge
from .transport import Backoff, HttpTransport, Response, ResponseTooLarge, media_type

log = logging.getLogger("mcp_lossless.client")

NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
"""The revisions this client speaks. It offers one (the newest unless told otherwise) and accepts any of these
in the server's answer (lifecycle version negotiation). 2026-07-28 is not among them: the client never sends it."""


@dataclass(frozen=True, slots=True)
class ProgressUpdate:
    progress: float
    total: float | None
    message: str | None


ProgressCallback = Callable[[ProgressUpdate], None]


@dataclass(frozen=True, slots=True)
class ServerInfo:
    protocol_version: str
    session_id: str | None
    info: Mapping[str, Any]
    capabilities: Mapping[str, Any]
    instructions: str | None


MessageCallback = Callable[[Mapping[str, Any]], None]
"""Called with each notification (other than progress) that the server sends on a call's stream."""


class _Waiter:
    __slots__ = ("done", "handlers", "on_message", "on_progress", "outcome")

    def __init__(
        self,
        on_progress: ProgressCallback | None,
        on_message: MessageCallback | None = None,
        handlers: dict[str, InputHandler] | None = None,
    ) -> None:
        self.done = anyio.Event()
        self.on_progress = on_progress
        self.on_message = on_message
        self.handlers = handlers
        """The call's own input handlers (merged over the session's), or ``None``: the session's answer."""
        self.outcome: CallOutcome | None = None


class Session:
    """One MCP session over Streamable HTTP, re-established transparently when the server loses it."""

    def __init__(
        self,
        transport: HttpTransport,
        auth: Auth,
        *,
        policy: RecoveryPolicy | None = None,
        backoff: Backoff | None = None,
        client_info: Mapping[str, Any] | None = None,
        rng: random.Random | None = None,
        protocol_version: str = protocol.LATEST,
        input_handlers: Mapping[str, InputHandler] | None = None,
        input_methods: Collection[str] = (),
    ) -> None:
        if protocol_version not in protocol.HANDSHAKE_VERSIONS:
            raise ValueError(
                f"protocol version {protocol_version!r} is not one of {', '.join(protocol.HANDSHAKE_VERSIONS)}"
            )
        self.offered_version = protocol_version
        self.transport = transport
        self.auth = auth
        self.backoff = backoff or Backoff()
        self._rng = rng or random.SystemRandom()
        self._prefix = f"{self._rng.getrandbits(64):016x}"
        """Wire ids start with this unguessable prefix, so they never collide with another client's."""
        self.ledger = Ledger(self._prefix, policy)
        self.client_info = dict(client_info or {"name": "mcp-lossless", "version": __version__})
        self._handlers = checked(input_handlers)
        """Answers to the server's requests on a call's stream (elicitation, sampling, roots), by method."""
        self._offered = offered(self._handlers, input_methods)
        """The capabilities ``initialize`` offers: the session's handlers' and those its calls bring handlers for."""
        self.server: ServerInfo | None = None
        self._tg: TaskGroup | None = None
        self._waiters: dict[CallKey, _Waiter] = {}
        self._scopes: dict[StreamKey, anyio.CancelScope] = {}
        self._ready = anyio.Event()
        self._handshakes = 0
        self._closing = False
        self._notices: set[anyio.Event] = set()
        """Cancel notices still being sent: ``close`` lets them reach the server before its DELETE."""
        self._broken: McpClientError | None = None
        """Why the session is gone for good (a new one could not be started after the server lost it)."""

    # ---- lifecycle ----------------------------------------------------------------------------------

    async def start(self, tg: TaskGroup) -> ServerInfo:
        self._tg = tg
        return await self._initialize()

    async def close(self) -> None:
        """Fail what is still pending with :class:`ClientClosed`, then end the session on the server."""
        self._closing = True
        for key in self.ledger.pending():
            self._apply(self.ledger.cancel(key, "client closed"))
        with anyio.move_on_after(2):
            for sent in list(self._notices):
                await sent.wait()
        if self.transport.session_id is not None and self._ready.is_set():
            with anyio.move_on_after(5), _BestEffort():
                await self.transport.delete(await self.auth.token(frozenset()))

    async def _initialize(self) -> ServerInfo:
        """The handshake (outside the ledger: nothing is pending on a session that does not exist yet)."""
        self._handshakes += 1
        transport = self.transport
        transport.session_id = None
        transport.protocol_version = None
        message = {
            "jsonrpc": "2.0",
            "id": f"{self._prefix}-init-{self._handshakes}",
            "method": "initialize",
            "params": {
                "protocolVersion": self.offered_version,
                "capabilities": self._offered,
                "clientInfo": self.client_info,
            },
        }
        response, session_id = await self._exchange(message)
        if "error" in response:
            error = response["error"] if isinstance(response["error"], dict) else {}
            raise RemoteError(int(error.get("code", 0)), str(error.get("message", "")), error.get("data"))
        result = response.get("result")
        if not isinstance(result, dict):
            raise ProtocolViolation("initialize answered without a result object")
        version = result.get("protocolVersion")
        if version not in protocol.HANDSHAKE_VERSIONS:
            raise ProtocolViolation(
                f"offered protocol {self.offered_version}, the server answered {version!r}; "
                f"this client speaks {', '.join(protocol.HANDSHAKE_VERSIONS)} (for a 2026-07-28 server use open_client)"
            )
        transport.session_id = session_id
        transport.protocol_version = str(version)
        await self._post_notification({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.server = ServerInfo(
            protocol_version=str(version),
            session_id=session_id,
            info=result.get("serverInfo") or {},
            capabilities=result.get("capabilities") or {},
            instructions=result.get("instructions"),
        )
        log.info("session established: protocol %s, %s", version, "stateful" if session_id else "no session id")
        self._ready.set()
        return self.server

    async def _exchange(self, message: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """POST a request outside the ledger and return its response and the session id header."""
        for _ in range(self.ledger.policy.max_reauthorizations + 1):
            try:
                async with self.transport.post(message, await self.auth.token(frozenset())) as response:
                    status = response.status_code
                    if status in (401, 403):
                        challenge = parse_challenge(response.headers.get("www-authenticate"))
                        if challenge is not None:
                            self.auth.challenged(challenge)
                        await self.auth.reauthorize(frozenset(challenge.resources if challenge else ()))
                        continue
                    if status >= 400:
                        body = await self.transport.body(response)
                        reason = f"{message['method']} refused with HTTP {status}: {_snippet(body)}"
                        if status == 404 and not urlsplit(self.transport.url).path.strip("/"):
                            reason += "; this URL has no path, and an MCP endpoint usually has one, such as /mcp"
                        raise RequestRejected(reason)
                    session_id = response.headers.get("mcp-session-id")
                    return await self._single_response(response, message["id"]), session_id
            except NOT_SENT_ERRORS as exc:
                raise unreachable(self.transport.url, exc) from exc
            except (httpx.HTTPError, ResponseTooLarge, SseTooLarge) as exc:
                raise ProtocolViolation(
                    f"{message['method']} to {self.transport.url} failed: {describe_failure(exc)}"
                ) from exc
        raise AuthorizationFailed(f"{message['method']}: the server kept refusing new tokens")

    async def _single_response(self, response: Response, wire_id: object) -> dict[str, Any]:
        kind = media_type(response)
        if kind == "application/json":
            parsed = _json(await self.transport.body(response))
            if isinstance(parsed, dict) and parsed.get("id") == wire_id:
                return parsed
        elif kind == "text/event-stream":
            async for events, _, _ in self.transport.events(response):
                for event in events:
                    parsed = _json(event.data.encode()) if event.data else None
                    if isinstance(parsed, dict) and parsed.get("id") == wire_id and "method" not in parsed:
                        return parsed
        raise ProtocolViolation(f"no response to {wire_id!r} ({response.status_code} {kind or 'no content type'})")

    # ---- calls --------------------------------------------------------------------------------------

    async def request(
        self,
        spec: CallSpec,
        deadline: float | None,
        on_progress: ProgressCallback | None = None,
        on_message: MessageCallback | None = None,
        input_handlers: Mapping[str, InputHandler] | None = None,
    ) -> dict[str, Any]:
        """Send ``spec`` and wait for its one outcome: the ``result`` object, or a typed exception.

        ``input_handlers`` answer the server's requests on this call's stream (over the session's, by method)."""
        if self._closing:
            raise ClientClosed("the client is closed")
        if self._broken is not None:
            raise SessionLost(f"no session: {self._broken.reason}")
        handlers = for_call(self._handlers, input_handlers) if input_handlers else None
        key, actions = self.ledger.begin(spec)
        waiter = self._waiters[key] = _Waiter(on_progress, on_message, handlers)
        self._apply(actions)
        try:
            with anyio.move_on_after(deadline if deadline is not None else math.inf):
                await waiter.done.wait()
        except BaseException:
            self._apply(self.ledger.cancel(key, "the caller cancelled the call"))
            raise
        finally:
            self._waiters.pop(key, None)
        if waiter.outcome is None:
            self._apply(self.ledger.expire(key))
            waiter.outcome = Failure(FailureKind.DEADLINE, f"no outcome within {deadline:.3g} s")
        return _unwrap(waiter.outcome)

    async def request_batch(
        self, specs: Sequence[CallSpec], deadline: float | None, on_progress: Sequence[ProgressCallback | None]
    ) -> list[dict[str, Any] | McpClientError]:
        """Send ``specs`` together and wait for every outcome: each call's ``result``, or its typed error.

        One JSON-RPC batch on one stream where the negotiated protocol allows it (2025-03-26), else one POST
        per call, all in flight at once. One deadline covers them all.
        """
        if self._closing:
            raise ClientClosed("the client is closed")
        if self._broken is not None:
            raise SessionLost(f"no session: {self._broken.reason}")
        if not specs:
            return []
        await self._ready.wait()
        if protocol.allows_batches(self.transport.protocol_version or ""):
            keys, actions = self.ledger.begin_batch(specs)
        else:
            keys, actions = [], []
            for spec in specs:
                key, sends = self.ledger.begin(spec)
                keys.append(key)
                actions += sends
        waiters = [_Waiter(callback) for callback in on_progress]
        self._waiters.update(zip(keys, waiters, strict=True))
        self._apply(actions)
        try:
            with anyio.move_on_after(deadline if deadline is not None else math.inf):
                for waiter in waiters:
                    await waiter.done.wait()
        except BaseException:
            for key in keys:
                self._apply(self.ledger.cancel(key, "the caller cancelled the call"))
            raise
        finally:
            for key in keys:
                self._waiters.pop(key, None)
        outcomes: list[dict[str, Any] | McpClientError] = []
        for key, waiter in zip(keys, waiters, strict=True):
            if waiter.outcome is None:
                self._apply(self.ledger.expire(key))
                waiter.outcome = Failure(FailureKind.DEADLINE, f"no outcome within {deadline:.3g} s")
            try:
                outcomes.append(_unwrap(waiter.outcome))
            except McpClientError as exc:
                outcomes.append(exc)
        return outcomes

    # ---- executing actions --------------------------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        """Execute the ledger's decisions, in order. The match is exhaustive over :data:`Action`.

        ``assert_never`` makes that a type check: were an action added to :mod:`mcp_lossless.core.actions`
        and not handled here, ``action`` would not be narrowed to ``Never`` in the last case and
        ``mypy --strict`` would fail (``Argument 1 to "assert_never" has incompatible type``).
        ``tests/unit/test_actions_handled.py`` also checks that the cases name every member of the union.
        """
        for action in actions:
            self._log(action)
            match action:
                case SendCall() | SendBatch():
                    self._require_tg().start_soon(self._send, action, self._connection_scope(action.link.stream))
                case Resume():
                    self._require_tg().start_soon(self._resume, action, self._connection_scope(action.link.stream))
                case Reauthorize():
                    self._require_tg().start_soon(self._reauthorize, action)
                case CloseStream():
                    scope = self._scopes.pop(action.stream, None)
                    if scope is not None:
                        scope.cancel()
                case Resolve():
                    waiter = self._waiters.get(action.call)
                    if waiter is not None:
                        waiter.outcome = action.outcome
                        waiter.done.set()
                case Progress():
                    self._progress(action)
                case CancelOnServer():
                    if not self._closing and self._ready.is_set():
                        params = {"requestId": action.wire_id, "reason": action.reason}
                        message = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
                        self._notify_quietly(message)
                case Incoming():
                    self._incoming(action.stream, action.message)
                case Report():
                    pass  # a dropped frame or a decision: ``_log`` above has written it down, nothing to run
                case _:
                    assert_never(action)

    def _connection_scope(self, stream: StreamKey) -> anyio.CancelScope:
        """The scope of a new connection of ``stream``; the previous one (if any) is cancelled."""
        scope = anyio.CancelScope()
        previous = self._scopes.get(stream)
        if previous is not None:
            previous.cancel()
        self._scopes[stream] = scope
        return scope

    def _release(self, stream: StreamKey, scope: anyio.CancelScope) -> None:
        if self._scopes.get(stream) is scope:
            del self._scopes[stream]

    def _log(self, action: Action) -> None:
        if isinstance(action, SendCall) and action.reissue_of is not None:
            log.warning("re-issuing %r as %r: %s", action.reissue_of, action.message["id"], action.reason)
        elif isinstance(action, SendCall) and action.reason != "new call":
            log.info("sending %r again: %s", action.message["id"], action.reason)
        elif isinstance(action, SendBatch):
            log.info("sending a batch of %s: %s", ", ".join(repr(m["id"]) for m in action.messages), action.reason)
        elif isinstance(action, Resume):
            stream, cursor, attempt = action.link.stream, action.cursor, action.attempt
            log.info("resuming stream %d from %r (try %d): %s", stream, cursor, attempt, action.reason)
        elif isinstance(action, Reauthorize):
            log.warning("re-authorizing for %s: %s", " ".join(sorted(action.resources)) or "the server", action.reason)
        elif isinstance(action, Resolve) and isinstance(action.outcome, Failure):
            log.warning("call %r failed (%s): %s", action.wire_id, action.outcome.kind.value, action.outcome.reason)
        elif isinstance(action, Report):
            log.warning("stream %s: %s: %s", action.stream, action.what, action.detail)

    def _progress(self, action: Progress) -> None:
        waiter = self._waiters.get(action.call)
        if waiter is None or waiter.on_progress is None:
            return
        try:
            waiter.on_progress(ProgressUpdate(action.progress, action.total, action.message))
        except Exception:
            log.exception("progress callback failed")

    def _incoming(self, stream: StreamKey, message: Mapping[str, Any]) -> None:
        method = message.get("method")
        if "id" in message:
            self._answer(message, self._handlers_on(stream))
            return
        for key in self.ledger.calls_on(stream):
            waiter = self._waiters.get(key)
            if waiter is not None and waiter.on_message is not None:
                try:
                    waiter.on_message(message)
                except Exception:
                    log.exception("message callback failed")
        if method == "notifications/message":
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            severe = params.get("level") in ("error", "critical", "alert", "emergency")
            level = logging.WARNING if severe else logging.INFO
            log.log(level, "server log [%s]: %s", params.get("logger", "-"), _snippet(orjson.dumps(params.get("data"))))

    def answer_standalone(self, message: Mapping[str, Any]) -> None:
        """A server's request on the session's standalone GET stream, which carries no call: answered from the
        session's own handlers, as one on a call's stream without handlers of its own is, never left waiting."""
        self._answer(message, self._handlers)

    def _answer(self, message: Mapping[str, Any], handlers: Mapping[str, InputHandler]) -> None:
        """Answer a server's request: from its handler, ``ping`` at once, anything else method-not-found."""
        method = message.get("method")
        if isinstance(method, str) and method in handlers:
            self._require_tg().start_soon(self._answer_request, message, handlers)
            return
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if method == "ping":
            reply["result"] = {}
        else:
            reply["error"] = {"code": codes.METHOD_NOT_FOUND, "message": f"client does not support {method}"}
        self._notify_quietly(reply)

    def _handlers_on(self, stream: StreamKey) -> Mapping[str, InputHandler]:
        """Who answers a server's request on ``stream``: the call riding on it, when it is the one call there and
        brought handlers of its own; else the session's (a batch's stream carries several calls)."""
        calls = self.ledger.calls_on(stream)
        if len(calls) == 1:
            waiter = self._waiters.get(next(iter(calls)))
            if waiter is not None and waiter.handlers is not None:
                return waiter.handlers
        return self._handlers

    async def _answer_request(self, message: Mapping[str, Any], handlers: Mapping[str, InputHandler]) -> None:
        """A server's request for client input, answered from its handler (as a 2026-07-28 server's rounds are);
        a handler that fails is answered with an error, so the tool waiting for it goes on (one that raises
        :class:`~.handlers.InputRefused`: with its code and message)."""
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        method, params = message["method"], message.get("params")
        try:
            asked = {"request": {"method": method, "params": params if isinstance(params, dict) else {}}}
            reply["result"] = (await answer_input(handlers, asked, f"the server's {method}"))["request"]
        except McpClientError as exc:  # the handler failed, or answered something that is not a result
            log.warning("answering the server's %s with an error: %s", method, exc.reason)
            refused = exc.__cause__
            if isinstance(refused, InputRefused):
                reply["error"] = {"code": refused.code, "message": refused.message}
            else:
                reply["error"] = {"code": codes.INTERNAL_ERROR, "message": exc.reason}
        self._notify_quietly(reply)

    # ---- connections --------------------------------------------------------------------------------

    async def _send(self, action: SendCall | SendBatch, scope: anyio.CancelScope) -> None:
        link = action.link
        body = action.message if isinstance(action, SendCall) else list(action.messages)
        with scope:
            if isinstance(action, SendCall) and action.attempt > 0:
                # A re-issue follows a failure (a drop, a restart): do not hammer a server that is coming back.
                await anyio.sleep(self.backoff.delay(action.attempt - 1, action.retry_ms, self._rng.random()))
            try:
                await self._ready.wait()
                sent_on = self.transport.session_id
                token = await self.auth.token(action.resources)
                async with self.transport.post(body, token) as response:
                    await self._consume(link, response, sent_on, resuming=False)
            except AuthorizationFailed as exc:
                self._apply(self.ledger.unauthorized(link, action.resources, exc.reason))
            except NOT_SENT_ERRORS as exc:
                self._apply(self.ledger.not_sent(link, describe_failure(exc)))
            except (httpx.HTTPError, ResponseTooLarge) as exc:
                self._apply(self.ledger.lost(link, describe_failure(exc)))
        self._release(link.stream, scope)

    async def _resume(self, action: Resume, scope: anyio.CancelScope) -> None:
        link = action.link
        with scope:
            await anyio.sleep(self.backoff.delay(action.attempt, action.retry_ms, self._rng.random()))
            try:
                await self._ready.wait()
                sent_on = self.transport.session_id
                token = await self.auth.token(action.resources)
                async with self.transport.resume(action.cursor, token) as response:
                    await self._consume(link, response, sent_on, resuming=True)
            except AuthorizationFailed as exc:
                self._apply(self.ledger.unauthorized(link, action.resources, exc.reason))
            except (httpx.HTTPError, ResponseTooLarge) as exc:
                self._apply(self.ledger.lost(link, describe_failure(exc)))
        self._release(link.stream, scope)

    async def _consume(self, link: Link, response: Response, sent_on: str | None, resuming: bool) -> None:
        """Turn one HTTP response into ledger inputs."""
        status = response.status_code
        kind = media_type(response)
        if 200 <= status < 300:
            if kind == "text/event-stream":
                await self._read_stream(link, response)
            elif status == 202 and not resuming:
                self._apply(self.ledger.accepted(link))
            elif kind == "application/json" and not resuming:
                self._apply(self.ledger.json_body(link, await self.transport.body(response)))
            else:
                what = "resume" if resuming else "request"
                self._apply(self.ledger.ended(link, f"{what} answered {status} {kind or 'without a body type'}"))
            return
        body = await self.transport.body(response)
        parsed = _json(body)
        detail = f"HTTP {status}: {_snippet(body)}"
        if status in (401, 403):
            challenge = parse_challenge(response.headers.get("www-authenticate"))
            required: list[str] = list(challenge.resources) if challenge else []
            helps = remedy(_refusal_data(parsed))  # the SEP-2643 envelope, else our own fields
            required += sorted(helps.resources)
            scopes = sorted(helps.scopes)
            if challenge is not None:
                self.auth.challenged(challenge)
                detail = f"HTTP {status} {challenge.error or ''}: {challenge.description or _snippet(body)}"
            self._apply(self.ledger.unauthorized(link, required, detail, scopes))
        elif status == 404 and sent_on is not None:
            self._session_lost(link, sent_on, resuming)
        elif 400 <= status < 500 and resuming:
            reason = parsed.get("error") if isinstance(parsed, dict) else None
            self._apply(self.ledger.cursor_rejected(link, f"{reason or 'HTTP ' + str(status)} ({detail})"))
        elif 400 <= status < 500 and isinstance(parsed, dict) and parsed.get("id") is not None:
            self._apply(self.ledger.json_body(link, body))
        elif 400 <= status < 500:
            self._apply(self.ledger.rejected(link, detail))
        else:
            self._apply(self.ledger.server_failed(link, detail))

    async def _read_stream(self, link: Link, response: Response) -> None:
        try:
            async for events, last_event_id, reconnection_ms in self.transport.events(response):
                if not self.ledger.is_current(link):
                    return  # superseded or finished; its cancellation just has not landed yet
                self._apply(self.ledger.received(link, events, last_event_id, reconnection_ms))
        except SseTooLarge as exc:
            self._apply(self.ledger.ended(link, str(exc)))
        except httpx.HTTPError as exc:
            self._apply(self.ledger.ended(link, f"connection dropped: {describe_failure(exc)}"))
        else:
            self._apply(self.ledger.ended(link, "the server closed the stream"))

    async def _reauthorize(self, action: Reauthorize) -> None:
        try:
            await self.auth.reauthorize(action.resources, action.scopes)
        except AuthorizationFailed as exc:
            self._apply(self.ledger.reauthorization_failed(action.stream, exc.reason))
        else:
            self._apply(self.ledger.reauthorized(action.stream))

    def _session_lost(self, link: Link, sent_on: str, resuming: bool) -> None:
        """A 404 for our session id: start a new session once, and let the ledger recover the calls.

        A POST answered 404 was not processed and may simply be sent again; a resume answered 404 belongs
        to a call that was processed, so it follows the may-have-run rules.
        """
        if sent_on != self.transport.session_id or not self._ready.is_set():
            if resuming:
                self._apply(self.ledger.cursor_rejected(link, "the session ended"))
            else:
                self._apply(self.ledger.not_sent(link, "sent on a session that has ended"))
            return
        self._ready = anyio.Event()
        self._apply(self.ledger.session_lost("HTTP 404 for the session id", refused=None if resuming else link))
        self._require_tg().start_soon(self._reinitialize)

    async def _reinitialize(self) -> None:
        try:
            await self._initialize()
        except McpClientError as exc:
            log.error("could not start a new session: %s", exc.reason)
            self._broken = exc
            self._apply(self.ledger.session_failed(f"the session was lost and could not be re-established: {exc}"))

    async def _post_notification(self, message: Mapping[str, Any]) -> None:
        async with self.transport.post(message, await self.auth.token(frozenset())) as response:
            await response.aread()

    def _notify_quietly(self, message: Mapping[str, Any]) -> None:
        """Send a notification in the background; registered at once, so ``close`` waits for it."""
        sent = anyio.Event()
        self._notices.add(sent)
        self._require_tg().start_soon(self._post_quietly, message, sent)

    async def _post_quietly(self, message: Mapping[str, Any], sent: anyio.Event) -> None:
        try:
            with _BestEffort():
                await self._post_notification(message)
        finally:
            sent.set()
            self._notices.discard(sent)

    def _require_tg(self) -> TaskGroup:
        if self._tg is None:
            raise RuntimeError("the session is not started")
        return self._tg


class _BestEffort:
    """Best-effort sends (cancel notices, DELETE): a failure is logged, never raised."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, httpx.HTTPError | McpClientError):
            log.info("best-effort request failed: %r", exc)
            return True
        return False


_FAILURES: dict[FailureKind, type[McpClientError]] = {
    FailureKind.NOT_SENT: ConnectionFailed,
    FailureKind.REJECTED: RequestRejected,
    FailureKind.AUTHORIZATION: AuthorizationFailed,
    FailureKind.PROTOCOL: ProtocolViolation,
    FailureKind.DEADLINE: DeadlineExceeded,
    FailureKind.CANCELLED: ClientClosed,
}


def _unwrap(outcome: CallOutcome) -> dict[str, Any]:
    """The ``result`` of an answered call, or the typed exception for everything else."""
    if isinstance(outcome, Answered):
        message = outcome.message
        error = message.get("error")
        if isinstance(error, dict):
            raise RemoteError(int(error.get("code", 0)), str(error.get("message", "")), error.get("data"))
        result = message.get("result")
        if not isinstance(result, dict):
            raise ProtocolViolation(f"the response to {message.get('id')!r} has no result object")
        return result
    if outcome.kind is FailureKind.MAY_HAVE_RUN:
        raise CallMayHaveRun(outcome.reason, outcome.error)
    if outcome.kind is FailureKind.SESSION_LOST:
        raise SessionLost(outcome.reason, outcome.error)
    raise _FAILURES[outcome.kind](outcome.reason)


def _refusal_data(parsed: object) -> object:
    """The refusal's data in a 401/403 body: a JSON-RPC error's ``data`` (a refused call), or the body itself (a
    refused resume, whose fields are at the top)."""
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return parsed["error"].get("data")
    return parsed


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _snippet(raw: bytes, limit: int = 200) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    return text if len(text) <= limit else text[:limit] + "…"
