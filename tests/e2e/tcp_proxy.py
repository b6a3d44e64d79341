"""A TCP proxy on 127.0.0.1 whose network can be cut, for fault-injection tests.

`TcpProxy` forwards every connection to an upstream port (changeable: a restarted controller may listen
elsewhere). `partition()` cuts the network the way a pulled cable does for a while: no byte moves in
either direction and new connections are held unanswered, but nothing is dropped or reset; `heal()`
delivers what was held, as TCP retransmission would after a partition shorter than its timeout. A
connection whose upstream closes (a killed controller) or cannot be reached is closed downstream too.

The proxy runs its own event loop in a daemon thread, so a test that blocks does not stall it; its
methods may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class TcpProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`upstream_port`. `start()`, then `stop()`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.num_connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._open = asyncio.Event()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> TcpProxy:
        """Listen on a free port (then in `port`) and forward; returns self."""
        self._thread.start()
        self._call(self._listen())
        return self

    def set_upstream(self, port: int) -> None:
        """Forward new connections to `port` from now on (existing ones keep their upstream)."""
        self.upstream_port = port

    def partition(self) -> None:
        """Stop moving bytes, both ways, on every connection; hold new connections."""
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        """Move bytes again, held ones first."""
        self._loop.call_soon_threadsafe(self._open.set)

    def stop(self) -> None:
        """Close the listener and every connection, and end the thread."""
        if self._thread.is_alive():
            self._call(self._close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def _call(self, coroutine) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _listen(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        self._writers.add(client_writer)
        try:
            await self._open.wait()
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            except OSError:
                return
            self._writers.add(upstream_writer)
            try:
                pumps = [asyncio.ensure_future(self._pump(client_reader, upstream_writer)),
                         asyncio.ensure_future(self._pump(upstream_reader, client_writer))]
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                for pump in pumps:
                    pump.cancel()
            finally:
                self._writers.discard(upstream_writer)
                upstream_writer.close()
        finally:
            self._writers.discard(client_writer)
            client_writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                await self._open.wait()  # a partition holds the bytes read, and stops reading more
                writer.write(data)
                await writer.drain()
