"""A primary, a replica and (optionally) three Sentinels on loopback, wired so a test can stage a failover.

What production Redis high availability looks like to mcp-lossless, reduced to what a test must control:

- **The replication link** runs through a :class:`Relay` in the test process. Freezing it stops the primary's
  bytes from reaching the replica (the relay reads nothing more), so the replica *lags*: whatever the primary
  acknowledges meanwhile is missing on the replica. A failover then loses those writes, as a real one with
  asynchronous replication may.
- **The endpoint** the mcp-lossless servers connect to (``redis://127.0.0.1:<endpoint port>``) is another
  :class:`Relay` whose target :meth:`RedisTopology.flip_endpoint` switches, as the DNS name of a managed Redis
  flips to the promoted node.
- **Sentinels** (``redis-server --sentinel``) monitor the primary directly; with
  ``down-after-milliseconds`` 500 they promote the replica a few seconds after :meth:`RedisTopology.kill_primary`.
  :attr:`RedisTopology.sentinel_url` is the ``redis+sentinel://`` store spec naming them.

Both Redis processes persist as :mod:`tests.support.redis_server` does (append-only file, ``appendfsync always``,
``noeviction``). Everything binds 127.0.0.1; :func:`redis_topology` stops every process and relay it started.
The relays run on an event loop of their own thread, so a test may block its own loop (or have none) while
bytes keep flowing, and every control method is synchronous and safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import redis

from tests.support.redis_server import RedisServer, redis_server_binary

T = TypeVar("T")

SERVICE = "mcpl"
"""The name the Sentinels monitor the primary under (the SERVICE_NAME of a ``redis+sentinel://`` spec)."""
DOWN_AFTER_MS = 500
"""How long the primary must be silent before a Sentinel counts it down: promotion follows in a few seconds."""
FAILOVER_TIMEOUT_MS = 3000
"""Sentinel's failover timeout; a failed election is retried after twice this."""


class Relay:
    """A TCP relay from ``127.0.0.1:port`` to ``127.0.0.1:target``, frozen, cut or re-targeted at will.

    Each accepted connection gets its own connection to the target and two one-way pumps. A frozen direction
    reads nothing more from its source: the bytes wait in the kernel's socket buffers (then in the sender's
    output buffer), not in the relay, and a chunk read just before the freeze is held until the thaw. So once
    :meth:`freeze` returns, no byte of that direction reaches the other side until :meth:`thaw`.

    "down" is target → client (for the replication link: primary → replica, the stream of writes); "up" is
    client → target.
    """

    def __init__(self, target: int, name: str) -> None:
        self.target = target
        self.name = name
        self.port = 0
        """The listening port, known once :meth:`start` returned (bound to port 0: no race for a free one)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"relay-{name}", daemon=True)
        self._server: asyncio.Server | None = None
        self._flowing: dict[str, asyncio.Event] = {}
        self._connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen())

    async def _listen(self) -> None:
        self._flowing = {"down": asyncio.Event(), "up": asyncio.Event()}
        for gate in self._flowing.values():
            gate.set()
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def _call(self, work: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    def _run(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the relay's loop and return once it ran: the pumps see its effect from then on."""

        async def run() -> None:
            action()

        self._call(run())

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:  # the target is down: the client sees its connection closed, as with a dead node
            client_writer.transport.abort()
            return
        pair = (client_writer, target_writer)
        self._connections.add(pair)
        try:
            await asyncio.gather(
                self._pump(client_reader, target_writer, self._flowing["up"]),
                self._pump(target_reader, client_writer, self._flowing["down"]),
            )
        finally:
            self._connections.discard(pair)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event) -> None:
        try:
            while True:
                await flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await flowing.wait()  # read just before a freeze: held here, delivered after the thaw
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.transport.abort()  # one side gone: the other sees it at once, as through a dead node

    def freeze(self, *, down: bool = True, up: bool = False) -> None:
        """Stop relaying the given directions (default: target → client) until :meth:`thaw`."""

        def stop() -> None:
            for name, frozen in (("down", down), ("up", up)):
                if frozen:
                    self._flowing[name].clear()

        self._run(stop)

    def thaw(self) -> None:
        """Relay both directions again, starting with whatever was held back."""

        def resume() -> None:
            for gate in self._flowing.values():
                gate.set()

        self._run(resume)

    def cut(self) -> None:
        """Abort every relayed connection (both ends get a reset), discarding what was not relayed yet."""

        def abort() -> None:
            for client, target in list(self._connections):
                client.transport.abort()
                target.transport.abort()
            self._connections.clear()

        self._run(abort)

    def flip(self, target: int, *, cut: bool = True) -> None:
        """Send new connections to ``target``. ``cut`` (default) aborts the existing ones, as when the old node
        is dead; ``cut=False`` leaves them on the old node, as a DNS flip does to connections to a live one."""

        def retarget() -> None:
            self.target = target

        self._run(retarget)
        if cut:
            self.cut()

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self.cut()

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
            pumps = asyncio.all_tasks() - {asyncio.current_task()}
            for pump in pumps:  # a frozen pump waits for a thaw that will not come
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

        self._call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


class SentinelServer(RedisServer):
    """``redis-server CONFIG --sentinel`` monitoring ``primary_port`` as :data:`SERVICE`, quorum 2.

    Sentinel rewrites its configuration file as it learns the topology, so each one gets its own directory.
    """

    def __init__(
        self,
        binary: str,
        directory: Path,
        primary_port: int,
        quorum: int = 2,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
    ) -> None:
        super().__init__(binary, directory)
        self.primary_port = primary_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def command(self) -> list[str]:
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            "daemonize no\n"
            f'dir "{self.directory}"\n'
            f'logfile "{self.log}"\n'
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        return [self.binary, str(config), "--sentinel"]


class RedisTopology:
    """The processes and relays of one staged deployment; see the module docstring for the wiring."""

    def __init__(
        self,
        primary: RedisServer,
        replica: RedisServer,
        link: Relay,
        endpoint: Relay,
        sentinels: list[SentinelServer],
    ) -> None:
        self.primary = primary
        self.replica = replica
        self.link = link
        """The replica's replication connection to the primary runs through this relay."""
        self.endpoint = endpoint
        """What mcp-lossless servers connect to; its target is the current primary until flipped."""
        self.sentinels = sentinels

    @property
    def endpoint_url(self) -> str:
        """``redis://`` spec of the endpoint relay (append ``?prefix=…`` and other settings as needed)."""
        return f"redis://127.0.0.1:{self.endpoint.port}"

    @property
    def sentinel_url(self) -> str:
        """``redis+sentinel://`` spec naming every Sentinel and :data:`SERVICE`."""
        if not self.sentinels:
            raise RuntimeError("this topology was started without Sentinels")
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    @staticmethod
    def client(server: RedisServer) -> redis.Redis:
        """A direct (synchronous) client of one process, bypassing the relays; the caller closes it."""
        return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5, socket_connect_timeout=2)

    def role(self, server: RedisServer) -> str:
        """``master`` or ``slave``, as the process itself reports it."""
        with self.client(server) as direct:
            return str(direct.info("replication")["role"])

    def freeze_link(self) -> None:
        """The primary's writes stop reaching the replica: it lags until :meth:`thaw_link`."""
        self.link.freeze()

    def thaw_link(self) -> None:
        self.link.thaw()

    def wait_replicated(self, timeout: float = 5) -> None:
        """Return once the replica acknowledged every write the primary had accepted (``WAIT 1``).

        An event, not a poll: the primary asks the replica for its offset and answers when it is reached.
        """
        with self.client(self.primary) as direct:
            acknowledged = direct.execute_command("WAIT", 1, int(timeout * 1000))
        if acknowledged != 1:
            raise AssertionError(f"the replica did not acknowledge the primary's writes within {timeout}s")

    def kill_primary(self) -> None:
        """SIGKILL the primary: its clients' connections are reset, and it answers nothing more."""
        self.primary.kill()

    def promote_replica(self) -> None:
        """``REPLICAOF NO ONE``: the replica becomes a primary with whatever it had received."""
        with self.client(self.replica) as direct:
            direct.execute_command("REPLICAOF", "NO", "ONE")

    def rejoin_primary_as_replica(self, timeout: float = 20) -> None:
        """Start the killed primary again as a replica of the promoted one, as Sentinel reconfigures a master that
        comes back; return once it has synced (its own writes the promoted one never had are discarded)."""
        self.primary.extra_args = [
            *self.primary.extra_args,
            "--replicaof",
            "127.0.0.1",
            str(self.replica.port),
        ]
        self.primary.start()
        deadline = time.monotonic() + timeout
        while True:
            with self.client(self.primary) as direct:
                if direct.info("replication").get("master_link_status") == "up":
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"the old primary did not sync with the promoted replica in {timeout}s")
            time.sleep(0.02)  # readiness of another process: there is no event to await

    def swap_after_failover(self, timeout: float = 20) -> None:
        """Re-establish the pair after a failover to the replica, so the next failover can be staged the same way.

        The old primary becomes a replica of the promoted one, replicating *through the link relay* (re-targeted
        at the promoted node, thawed): started again if it was killed, told ``REPLICAOF`` if it lives (Sentinel
        failed over by itself, and made it replicate directly). The two swap roles: :attr:`primary` is the promoted
        node, :attr:`replica` the old primary, and :meth:`freeze_link` makes it lag as before. Returns once it
        synced (what the old primary had that the promoted one never received is discarded, as Redis does).
        """
        promoted, old = self.replica, self.primary
        with self.client(promoted) as direct:  # a full sync at once, not after Redis's 5 s wait for more replicas
            direct.config_set("repl-diskless-sync-delay", 0)
        self.link.flip(promoted.port)
        self.link.thaw()
        old.extra_args = ["--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", str(self.link.port)]
        if old.proc is None:
            old.start()
        else:
            with self.client(old) as direct:
                direct.execute_command("REPLICAOF", "127.0.0.1", self.link.port)
        self.primary, self.replica = promoted, old
        self._wait_replica_linked(timeout)

    def demote_primary(self) -> None:
        """The (live) primary follows the replica, as after a failover it survived: it answers writes ``READONLY``
        and ends blocking reads with ``UNBLOCKED``, on connections that stay open. Promote the replica first."""
        with self.client(self.primary) as direct:
            direct.execute_command("REPLICAOF", "127.0.0.1", self.replica.port)

    def flip_endpoint(self, server: RedisServer | None = None, *, cut: bool = True) -> None:
        """Point the endpoint at ``server`` (default: the replica), as a managed endpoint's DNS name flips."""
        self.endpoint.flip((server or self.replica).port, cut=cut)

    def sentinel_masters(self) -> list[tuple[str, int] | None]:
        """What each Sentinel answers to ``SENTINEL get-master-addr-by-name``, ``None`` where it cannot."""
        answers: list[tuple[str, int] | None] = []
        for sentinel in self.sentinels:
            with self.client(sentinel) as direct:
                try:
                    host, port = direct.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
                except redis.RedisError:
                    answers.append(None)
                    continue
            answers.append((host.decode(), int(port)))
        return answers

    def wait_sentinel_master(self, server: RedisServer | None = None, timeout: float = 30) -> None:
        """Wait until every Sentinel reports ``server`` (default: the replica) as the master.

        Readiness of other processes: Sentinel publishes the switch on a channel of the very master that died,
        so polling its answer (every 50 ms, bounded by ``timeout``) is the observable signal. Blocking: from
        async code run it with ``anyio.to_thread.run_sync``.
        """
        expected = ("127.0.0.1", (server or self.replica).port)
        deadline = time.monotonic() + timeout
        while True:
            answers = self.sentinel_masters()
            if all(answer == expected for answer in answers):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"Sentinels report {answers}, not {expected}, after {timeout}s")
            time.sleep(0.05)  # readiness of other processes: there is no event to await

    def _wait_replica_linked(self, timeout: float = 20) -> None:
        """The replica finished its initial sync (``master_link_status:up``) and the append-only file it writes
        after one (until then Redis refuses a SIGTERM: "Writing initial AOF, can't exit")."""
        deadline = time.monotonic() + timeout
        while True:
            with self.client(self.replica) as direct:
                linked = direct.info("replication").get("master_link_status") == "up"
                persistence = direct.info("persistence")
            if linked and not persistence["aof_rewrite_in_progress"] and not persistence["aof_rewrite_scheduled"]:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the replica did not sync with the primary in {timeout}s")
            time.sleep(0.02)  # readiness of another process: there is no event to await

    def _wait_sentinels_see_each_other(self, timeout: float = 20) -> None:
        """Every Sentinel knows the others and the replica: without that, no quorum and no failover."""
        deadline = time.monotonic() + timeout
        while True:
            views = []
            for sentinel in self.sentinels:
                with self.client(sentinel) as direct:
                    state = direct.sentinel_master(SERVICE)
                views.append((state["num-other-sentinels"], state["num-slaves"]))
            if all(view == (len(self.sentinels) - 1, 1) for view in views):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"Sentinels (others, replicas): {views} after {timeout}s")
            time.sleep(0.05)  # readiness of other processes (hello messages every 2 s): nothing to await


@contextlib.contextmanager
def redis_topology(
    directory: Path,
    *,
    sentinels: int = 0,
    down_after_ms: int = DOWN_AFTER_MS,
    failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
) -> Iterator[RedisTopology]:
    """Start a primary, a replica replicating through a relay, the endpoint relay and ``sentinels`` Sentinels
    (0 or at least 3 for a quorum of 2), each with its data under ``directory``; stop them all on exit.

    ``down_after_ms`` is the Sentinels' ``down-after-milliseconds``: the default is quick for one staged failover,
    but on a loaded machine a primary may miss it and be failed over by the Sentinels themselves; a run of many
    failovers wants a second or so."""
    if 0 < sentinels < 3:
        raise ValueError("Sentinel needs at least 3 processes for a quorum of 2 that survives one")
    binary = redis_server_binary()
    with contextlib.ExitStack() as stack:
        # A replica's full sync starts at once, not after Redis's default 5 s wait for other replicas to join it.
        primary = RedisServer(binary, _made(directory / "primary"), extra_args=["--repl-diskless-sync-delay", "0"])
        stack.callback(primary.stop)
        primary.start()
        link = Relay(primary.port, "link")
        stack.callback(link.close)
        link.start()
        replica = RedisServer(
            binary, _made(directory / "replica"), extra_args=["--replicaof", "127.0.0.1", str(link.port)]
        )
        stack.callback(replica.stop)
        replica.start()
        endpoint = Relay(primary.port, "endpoint")
        stack.callback(endpoint.close)
        endpoint.start()
        watchers = [
            SentinelServer(
                binary, _made(directory / f"sentinel-{n}"), primary.port, 2, down_after_ms, failover_timeout_ms
            )
            for n in range(sentinels)
        ]
        for watcher in watchers:
            stack.callback(watcher.stop)
            watcher.start()
        topology = RedisTopology(primary, replica, link, endpoint, watchers)
        topology._wait_replica_linked()
        if watchers:
            topology._wait_sentinels_see_each_other()
        yield topology


def _made(directory: Path) -> Path:
    directory.mkdir(parents=True)
    return directory
