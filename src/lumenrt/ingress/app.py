"""``ServerApp``: the engine, the inference service and the front ends on one event loop.

    app = ServerApp(engine, ServeOptions(http_port=8000, grpc_port=8001, tcp_port=8003))
    await app.start()          # listening; app.ports says where (port 0 = any free port)
    await app.shutdown()       # readiness false, new requests refused, in-flight ones finish

Shutdown order (what ``lumenrt serve`` does on SIGINT/SIGTERM):
  0. readiness turns false, and for ``limits.drain_delay_s`` new requests are still served: a load
     balancer that polls readiness stops sending here before anything is refused;
  1. the service stops accepting: every new request is answered 503 (the listeners stay open, so
     clients get a clear answer rather than a refused connection);
  2. requests in flight finish, for at most ``limits.grace_s``;
  3. the listeners close, then the front ends close their connections; the caller then closes
     the engine, which stops its workers (process mode: the worker processes exit and the shared
     memory segments are unlinked).

``ServerThread`` runs an app on a loop in a background thread, for tests and embedding.
"""

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from lumenrt.engine.engine import Engine
from lumenrt.ingress.auth import Gate
from lumenrt.ingress.loop_spin import LoopSpinner
from lumenrt.ingress.rate_limit import RateLimiter, RateLimits
from lumenrt.ingress.service import GRPC_SERVERS, InferenceService, ServeLimits
from lumenrt.ingress.shared_memory import SWEEP_INTERVAL_S, SharedMemoryRegistry
from lumenrt.ingress.tls import ServerTls, TlsFiles

logger = logging.getLogger(__name__)
WATCH_INTERVAL_S = 2.0  # how often the key and certificate files are checked for changes (guessed)


class FrontEnd(Protocol):
    port: int

    async def stop_listening(self) -> None:
        """Close the listening socket(s): no new connections."""

    async def close(self) -> None:
        """Close every connection (after in-flight requests were answered or the grace passed)."""


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    http_port: int | None = 8000  # None: this front end is off; 0: any free port
    grpc_port: int | None = 8001
    tcp_port: int | None = 8003
    limits: ServeLimits = field(default_factory=ServeLimits)
    cache_size_bytes: int = 0  # the response cache's budget; 0 = no cache (models that enable it warn)
    metrics: bool = True  # GET /metrics on the HTTP port (observability/metrics.py)
    metrics_port: int | None = None  # and on a port of their own (0: any free port; None: none)
    auth: Gate | None = None  # API keys and endpoint groups (ingress/auth.py); None: all open
    rate_limits: RateLimits | None = None  # per-client limits (ingress/rate_limit.py); None: none
    tls: TlsFiles | None = None  # TLS on HTTP, gRPC and TCP (ingress/tls.py); None: clear text
    # Triton's system shared-memory extension (ingress/shared_memory.py): off unless asked for
    allow_client_shm: bool = False
    max_shm_regions_per_client: int = 64
    client_shm_prefix: str = ""  # keys' object names must start with it ('': any name but lumenrt's own)
    # who serves gRPC: "h2", lumenrt's own HTTP/2 server (ingress/grpc_h2.py), or "grpcio" (grpc.aio)
    grpc_server: str = "h2"

    def __post_init__(self) -> None:
        if self.grpc_server not in GRPC_SERVERS:
            raise ValueError(f"grpc_server: {self.grpc_server!r} is not one of {', '.join(GRPC_SERVERS)}")


class ServerApp:
    def __init__(self, engine: Engine, options: ServeOptions | None = None) -> None:
        self.engine = engine
        self.options = options or ServeOptions()
        self.service = InferenceService(engine, self.options.limits, self.options.cache_size_bytes)
        self.service.warn_uncached(engine.models())
        if self.options.metrics:
            from lumenrt.observability.metrics import ServiceMetrics

            self.service.metrics = ServiceMetrics(self.service)
        self.service.gate = self.options.auth
        if self.options.allow_client_shm:
            self.service.shared_memory = SharedMemoryRegistry(
                self.options.max_shm_regions_per_client,
                prefix=self.options.client_shm_prefix,
                max_bytes_tensor=self.options.limits.max_body_bytes,
            )
        self._sweep_shm: asyncio.Task[None] | None = None
        limits = self.options.rate_limits
        self.service.limiter = RateLimiter(limits) if limits is not None and limits.active else None
        gate = self.options.auth
        if gate is not None and self.options.metrics_port is not None and not gate.is_open("metrics"):
            raise ValueError(
                "--metrics-port serves the metrics without a key check: with API keys, use GET /metrics "
                "on the HTTP port, or open the metrics group (--open-groups health metrics)"
            )
        # raises TlsError (a ValueError) naming the flag and file
        self.tls = ServerTls(self.options.tls) if self.options.tls is not None else None
        self.front_ends: dict[str, FrontEnd] = {}
        self._watch: asyncio.Task[None] | None = None

    @property
    def ports(self) -> dict[str, int]:
        return {name: fe.port for name, fe in self.front_ends.items()}

    async def start(self) -> None:
        opts = self.options
        loop = self.service.loop = asyncio.get_running_loop()  # the front ends' (service.py, ``loop``)
        spin_us = getattr(self.engine.settings, "loop_spin_us", 0)
        self.service.spinner = LoopSpinner(loop, spin_us) if spin_us else None
        try:
            if opts.http_port is not None:
                from lumenrt.ingress.http_server import start_http

                ssl = self.tls.context if self.tls is not None else None
                self.front_ends["http"] = await start_http(self.service, opts.host, opts.http_port, ssl)
            if opts.grpc_port is not None and opts.grpc_server == "grpcio":
                from lumenrt.ingress.grpc_server import start_grpc

                creds = self.tls.grpc_credentials() if self.tls is not None else None
                self.front_ends["grpc"] = await start_grpc(self.service, opts.host, opts.grpc_port, creds)
            elif opts.grpc_port is not None:
                from lumenrt.ingress.grpc_h2 import start_grpc_h2

                ssl = self.tls.h2_context if self.tls is not None else None
                self.front_ends["grpc"] = await start_grpc_h2(self.service, opts.host, opts.grpc_port, ssl)
            if opts.tcp_port is not None:
                from lumenrt.ingress.tcp_server import start_tcp

                ssl = self.tls.context if self.tls is not None else None
                self.front_ends["tcp"] = await start_tcp(self.service, opts.host, opts.tcp_port, ssl)
            if opts.metrics_port is not None and self.service.metrics is not None:
                from lumenrt.observability.metrics import MetricsListener

                self.front_ends["metrics"] = MetricsListener(
                    self.service.metrics, opts.host, opts.metrics_port, opts.tls
                )
            if self._watched():
                self._watch = asyncio.get_running_loop().create_task(self._watch_files())
            if self.service.shared_memory is not None:
                self._sweep_shm = asyncio.get_running_loop().create_task(self._sweep_shared_memory())
        except BaseException:
            await self._close_front_ends()
            self.service.loop = self.service.spinner = None
            raise

    # ---- keys and certificates: reloaded on SIGHUP (lumenrt serve) or when their files change ----

    def reload(self) -> list[str]:
        """Read the API keys and the TLS certificates again (what failed keeps the old ones, logged);
        returns what was reloaded."""
        done = []
        gate = self.service.gate
        if gate is not None and gate.source.path is not None and gate.reload():
            done.append("api keys")
        tls = self.tls
        if tls is not None:
            try:
                tls.reload()
                done.append("tls certificates")
            except ValueError as exc:
                logger.error("TLS certificates not reloaded, the old ones stay in use: %s", exc)
        return done

    def _watched(self) -> bool:
        gate = self.service.gate
        return (gate is not None and gate.source.path is not None) or self.tls is not None

    async def _watch_files(self) -> None:
        """Reload what changed on disk, checked every WATCH_INTERVAL_S (a stat per file)."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                gate = self.service.gate
                if gate is not None and gate.changed():
                    gate.reload()
                tls = self.tls
                if tls is not None and tls.changed():
                    tls.reload()
            except Exception as exc:  # a bad file keeps the old keys/certificates; keep watching
                logger.error("reload after a file change failed, the old settings stay in use: %s", exc)

    async def _sweep_shared_memory(self) -> None:
        """Unregister the regions whose object the client unlinked (shared_memory.py, invariant 7)."""
        registry = self.service.shared_memory
        assert registry is not None
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            registry.sweep()

    async def shutdown(self) -> bool:
        """Drain and stop; True if every in-flight request finished within the grace period."""
        if self._watch is not None:
            self._watch.cancel()
        if self._sweep_shm is not None:
            self._sweep_shm.cancel()
        await self.service.announce_drain(self.options.limits.drain_delay_s)
        self.service.stop_accepting()
        drained = await self.service.wait_idle(self.options.limits.grace_s)
        for fe in self.front_ends.values():
            with contextlib.suppress(Exception):
                await fe.stop_listening()
        await self._close_front_ends()
        if self.service.shared_memory is not None:
            self.service.shared_memory.close()  # every region unmapped, its descriptor closed
        self.service.loop = self.service.spinner = None
        return drained

    async def _close_front_ends(self) -> None:
        for fe in self.front_ends.values():
            with contextlib.suppress(Exception):
                await fe.close()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; kept for embedding
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class ServerThread:
    """An app on its own event loop in a background thread (tests, embedding)::

    with ServerThread(engine, ServeOptions(http_port=0, grpc_port=0, tcp_port=0)) as st:
        st.ports["http"]
    """

    def __init__(self, engine: Engine, options: ServeOptions | None = None) -> None:
        self.app = ServerApp(engine, options)
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="lumenrt-server", daemon=True)
        self.drained: bool | None = None

    @property
    def ports(self) -> dict[str, int]:
        return self.app.ports

    def call(self, coro: Any, timeout_s: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def start(self) -> "ServerThread":
        self._thread.start()
        self.call(self.app.start())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self.drained = self.call(self.app.shutdown(), timeout_s=self.app.options.limits.grace_s + 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
