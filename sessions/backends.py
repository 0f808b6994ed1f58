"""Which Redis a store talks to, from its URL: one server, a Sentinel-managed primary, or a Cluster.

    redis://[user:pass@]host:port[/db]            rediss://…  (TLS)           unix:///path.sock
    redis+sentinel://[user:pass@]host:port[,host:port…]/<master-name>[/db][?sentinel_password=…]
    redis+cluster://[user:pass@]host:port[,host:port…]                         rediss+… (TLS for both)

Each backend is redis-py's own client (``Redis``, ``Sentinel.master_for``, ``RedisCluster``), so failover
and slot redirection are redis-py's: a Sentinel pool asks the sentinels for the primary on every new
connection, a cluster client follows MOVED and refreshes its slot map. What differs per backend is kept
here and nowhere else:

- the pub/sub connection of the control bus. On a cluster, PUBLISH (also from a script) reaches the
  subscribers of every node, so the bus subscribes on any one node, and on the next one after a loss;
- which node is the primary now (Sentinel): asked of the sentinels at each heartbeat, so the control
  bus's pub/sub connection (and the pool's idle connections) leave an old primary that a partition
  cut off from its replicas: such a node still answers, as a primary, and relays nothing published
  on the new one;
- acknowledged writes (a voice, the spoken log) wait for one replica (``WAIT 1``) on the connection that
  wrote, where the primary has a replica: a write the gateway acknowledged survives its primary's
  failover. Whether a replica exists is learnt from ``ROLE`` (the store's heartbeat) or the cluster's
  slot map, so a lone primary never waits out WAIT's timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, unquote

import fakeredis
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, ResponseError

log = logging.getLogger("voxgate.sessions")

_embedded_server: fakeredis.FakeServer | None = None


def embedded_server() -> fakeredis.FakeServer:
    """The process's one FakeServer: every embedded store in this process shares its data."""
    global _embedded_server
    if _embedded_server is None:
        _embedded_server = fakeredis.FakeServer()
    return _embedded_server

BackendKind = Literal["redis", "sentinel", "cluster"]
SCHEMES: dict[str, tuple[BackendKind, bool]] = {
    "redis": ("redis", False), "rediss": ("redis", True), "unix": ("redis", False),
    "redis+sentinel": ("sentinel", False), "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False), "rediss+cluster": ("cluster", True),
}  # fmt: skip


@dataclass(frozen=True)
class RedisUrl:
    kind: BackendKind
    tls: bool
    hosts: tuple[tuple[str, int], ...]  # the server, the sentinels, or the cluster's seed nodes
    master: str | None = None  # Sentinel: the monitored primary's name
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    raw: str = field(default="", repr=False)


def parse_url(url: str) -> RedisUrl:
    """Parse the multi-host forms; ``redis://``/``rediss://``/``unix://`` stay redis-py's own (``raw``)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(f"unsupported Redis URL scheme {scheme!r}: use one of {', '.join(SCHEMES)}")
    kind, tls = SCHEMES[scheme.lower()]
    if kind == "redis":
        return RedisUrl("redis", tls, (), raw=url)
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    user = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, _, pw = userinfo.partition(":")
        user, password = unquote(user) or None, unquote(pw) or None
    hosts = tuple(_host_port(h) for h in netloc.split(",") if h)
    if not hosts:
        raise ValueError(f"a {scheme}:// URL needs at least one host:port")
    parts = [p for p in path.split("/") if p]
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    if kind == "sentinel":
        if not parts:
            raise ValueError(f"a {scheme}:// URL names its primary: {scheme}://host:port/<master-name>")
        db = int(parts[1]) if len(parts) > 1 else 0
        return RedisUrl("sentinel", tls, hosts, parts[0], db, user, password, params.get("sentinel_password"), url)
    if parts and parts != ["0"]:
        raise ValueError("a Redis Cluster has only database 0")
    return RedisUrl("cluster", tls, hosts, None, 0, user, password, None, url)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)


def redact(url: str) -> str:
    """The URL without its password or query (for the console and the log)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, q, _ = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{hosts}"
    return f"{scheme}://{netloc}{slash}{path}" + ("?…" if q else "")


class Backend:
    """A client for the store, a pub/sub connection for its control bus, and acknowledged writes."""

    kind: BackendKind

    def __init__(self, client: Any, kind: BackendKind) -> None:
        self.client = client
        self.kind = kind
        self.replicas = 0  # the primary's connected replicas, as the last ROLE said

    def pubsub(self) -> PubSub:
        return self.client.pubsub()  # type: ignore[no-any-return]

    def register_script(self, script: str) -> Any:
        """A Lua script the store calls as ``await s(keys=…, args=…)``."""
        return self.client.register_script(script)

    def learn_role(self, role: Sequence[Any]) -> None:
        """``ROLE`` on the primary: ``[b"master", offset, [[ip, port, offset], …]]``."""
        if role and role[0] in (b"master", "master") and len(role) > 2:
            self.replicas = len(role[2])

    def has_replica(self, key: str) -> bool:
        return self.replicas > 0

    async def acked(self, script: Any, keys: list[str], args: list[Any], wait_ms: int) -> tuple[Any, int | None]:
        """Run a write script; where a replica exists, WAIT (on the same connection) for one to hold it.
        Returns the script's answer and how many replicas acknowledged (None: no replica to wait for)."""
        if not self.has_replica(keys[0]):
            return await script(keys=keys, args=args), None
        pipe = self.client.pipeline(transaction=False)  # one connection: WAIT covers the script's write
        await script(keys=keys, args=args, client=pipe)  # queued: the pipeline loads it (SCRIPT LOAD) first
        pipe.execute_command("WAIT", 1, wait_ms)
        result, acks = await pipe.execute()
        return result, int(acks)

    async def role(self) -> object:
        return await self.client.execute_command("ROLE")

    async def ping(self) -> object:
        return await self.client.ping()

    async def primary(self) -> tuple[str, int] | None:
        """The address of the node that is the primary now, where something other than the connection
        itself says so (the sentinels); None: the node connected to is the one there is."""
        return None

    async def receivers(self, channel: str, counted: int) -> int:
        """How many subscribers a PUBLISH that answered ``counted`` reached."""
        return counted

    async def aclose(self) -> None:
        await self.client.aclose()


class SentinelBackend(Backend):
    def __init__(self, client: Any, sentinel: Sentinel) -> None:
        super().__init__(client, "sentinel")
        self.sentinel = sentinel

    async def primary(self) -> tuple[str, int] | None:
        # The pool's own question (every new connection asks it): when the answer changed, its idle
        # connections to the old primary are closed, so the next call reaches the new one.
        host, port = await self.client.connection_pool.get_master_address()
        return str(host), int(port)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.sentinel.aclose()


class ClusterBackend(Backend):
    """A cluster: scripts and transactions route by their first key (every key of one script shares the
    tenant's hash tag, so one slot); the control bus subscribes on one node at a time."""

    def __init__(self, client: RedisCluster, conn: dict[str, Any], *, node_timeout_s: float = 0.25) -> None:
        super().__init__(client, "cluster")
        self._conn = conn
        self.node_timeout_s = node_timeout_s  # one node's answer to a count (PUBSUB NUMSUB), at most
        self._next = 0
        self._node_clients: list[aioredis.Redis] = []

    def pubsub(self) -> PubSub:
        nodes = self.client.get_nodes() or self.client.startup_nodes.values()
        nodes = sorted(nodes, key=lambda n: n.name)
        node = nodes[self._next % len(nodes)]
        self._next += 1  # after a loss the bus reconnects to the next node: the lost one may be down
        client = aioredis.Redis(host=node.host, port=node.port, **self._conn)
        self._node_clients.append(client)
        del self._node_clients[:-2]  # the live one and the one just given up: older ones are closed
        return client.pubsub()

    def register_script(self, script: str) -> Any:
        return RoutedScript(self.client, script)

    def has_replica(self, key: str) -> bool:
        try:
            return self.client.get_node_from_key(key, replica=True) is not None
        except Exception:  # the slot map is being refreshed: treat as no replica, the write still lands
            return False

    async def acked(self, script: Any, keys: list[str], args: list[Any], wait_ms: int) -> tuple[Any, int | None]:
        # A cluster pipeline would send WAIT to every primary on connections of their own, which waits
        # for nothing: the script (as EVAL: no NOSCRIPT round) and WAIT go down one connection of the
        # key's primary instead. A slot that moved meanwhile falls back to the routed call, unwaited.
        if not self.has_replica(keys[0]):
            return await script(keys=keys, args=args), None
        node = self.client.get_node_from_key(keys[0])
        cmds = [PipelineCommand(0, "EVAL", script.script, len(keys), *keys, *args),
                PipelineCommand(1, "WAIT", 1, wait_ms)]  # fmt: skip
        await node.execute_pipeline(cmds)
        result, acks = cmds[0].result, cmds[1].result
        if isinstance(result, ResponseError) and str(result).startswith(("MOVED", "ASK")):
            return await script(keys=keys, args=args), None
        if isinstance(result, BaseException):
            raise result
        return result, int(acks) if isinstance(acks, int) else 0

    async def role(self) -> object:
        return None  # replicas per slot come from the slot map

    async def ping(self) -> object:
        # One node, not redis-py's default for PING (every node): with one node down the rest of the slots
        # are served, and a heartbeat that failed for that node would refuse every call (the breaker).
        # The default node is replaced by redis-py when it stops answering. Calls to the down node's slots
        # still fail, and are counted, on their own.
        return await self.client.ping(target_nodes=RedisCluster.DEFAULT_NODE)

    async def receivers(self, channel: str, counted: int) -> int:
        """PUBLISH counts the subscribers of the node that ran it; the others got it over the cluster bus,
        so every node is asked (cancels are rare: a barge-in). The message is out already: a node that is
        down or slow (``node_timeout_s``) is left out of the count, never an error, and the count is at
        least what PUBLISH counted."""
        answers = await asyncio.gather(*(self._numsub(node, channel) for node in self.client.get_nodes()))
        return max(counted, sum(answers))

    async def _numsub(self, node: ClusterNode, channel: str) -> int:
        try:
            async with asyncio.timeout(self.node_timeout_s):
                reply = await node.execute_command("PUBSUB", "NUMSUB", channel)
            return int(reply[1])
        except (aioredis.RedisError, OSError, TimeoutError) as e:
            log.info("session store: cluster node %s did not count subscribers (%s); left out of the count",
                     node.name, type(e).__name__)  # fmt: skip
            return 0

    async def aclose(self) -> None:
        for c in self._node_clients:
            await c.aclose()
        await self.client.aclose()


class RoutedScript:
    """A script on a cluster, sent only to the node its keys live on: redis-py's ``Script`` answers a
    NOSCRIPT by loading the script on every primary, so with one node down the first call of each script
    failed on every slot. This one answers it with EVAL, routed by key (which caches it there too)."""

    def __init__(self, client: RedisCluster, script: str) -> None:
        self._client = client
        self._inner = client.register_script(script)
        self.script = script

    async def __call__(self, keys: list[str] | None = None, args: list[Any] | None = None) -> Any:
        keys, args = keys or [], args or []
        try:
            return await self._client.evalsha(self._inner.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.eval(self.script, len(keys), *keys, *args)


def connect(url: str, *, connect_timeout_s: float, op_timeout_s: float, max_connections: int = 256) -> Backend:
    """A backend for ``url``, its pool (per node on a cluster) sized for ``max_connections``. Nothing is
    contacted yet (``SessionStore.start`` pings)."""
    u = parse_url(url)
    conn: dict[str, Any] = dict(
        socket_connect_timeout=connect_timeout_s, socket_timeout=op_timeout_s,
        # Few, quick retries of a refused or reset connection; a timeout is not retried (the breaker
        # bounds the whole call anyway): a stalled Redis must cost one op timeout, not three.
        retry=Retry(ExponentialBackoff(cap=0.1, base=0.01), 2, supported_errors=(aioredis.ConnectionError,)),
        health_check_interval=10, max_connections=max_connections,
    )  # fmt: skip
    if u.kind == "redis":
        return Backend(aioredis.from_url(u.raw, **conn), "redis")
    auth: dict[str, Any] = {"username": u.username, "password": u.password}
    if u.tls:
        auth["ssl"] = True
    if u.kind == "sentinel":
        assert u.master is not None
        sentinel_conn = {"socket_connect_timeout": connect_timeout_s, "socket_timeout": op_timeout_s,
                         "password": u.sentinel_password, **({"ssl": True} if u.tls else {})}  # fmt: skip
        sentinel = Sentinel(list(u.hosts), sentinel_kwargs=sentinel_conn, **conn, **auth)
        client = sentinel.master_for(u.master, redis_class=aioredis.Redis, db=u.db)
        return SentinelBackend(client, sentinel)
    nodes = [ClusterNode(h, p) for h, p in u.hosts]
    node_conn = {k: v for k, v in conn.items() if k != "health_check_interval"} | auth
    client = RedisCluster(
        startup_nodes=nodes, socket_connect_timeout=connect_timeout_s, socket_timeout=op_timeout_s,
        # A moved slot or a failed-over primary is retried by redis-py within the store's op timeout.
        retry=Retry(ExponentialBackoff(cap=0.1, base=0.01), 2), max_connections=max_connections, **auth,
    )  # fmt: skip
    # A cancel's count asks every node within a share of its op timeout (ClusterBackend.receivers).
    return ClusterBackend(client, node_conn, node_timeout_s=op_timeout_s / 2)
