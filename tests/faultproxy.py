"""A small HTTP/1.1 proxy for tests: records what the server received, injects faults.

It sits between a client and a real server (the emulator process) on
loopback, with plain asyncio streams. For each request it records the method,
path, headers and body (`Seen`), then asks `decide(seen)` what to do:

- `None`: forward to the upstream server and copy the response back;
- `"reset"`: reset the connection before any response byte (a TCP RST, as a
  busy vLLM does to some of 160-256 simultaneous new connections);
- `"html502"`: answer 502 with an nginx-style HTML page;
- `"hang"`: accept the request and never answer;
- a name in `extra_faults`: send that raw response;
- `"cut_before_content"`: forward, pass the response headers and a stream's
  first (role-only) event on, then reset: the stream dies before any content;
- `"stall_after_headers"`: forward, pass the response headers on, then send
  only SSE keep-alive comments (never an event).

Every exchange uses `Connection: close`, so each request has its own
connections and the proxy never has to parse response framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ("FaultProxy", "Seen")

HTML_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n"
    + b"<!-- a padding comment to make the page long -->\r\n" * 40
    + b"</body>\r\n</html>\r\n"
)


ROLE_EVENT = (
    b'data: {"id":"chatcmpl-proxy","object":"chat.completion.chunk","model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    b'"finish_reason":null}]}\n\n'
)


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (the emulator streams with chunked encoding)."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST, not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(slots=True)
class Seen:
    """One request as the proxy received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class FaultProxy:
    """`async with FaultProxy(upstream_url, decide=...) as proxy:` then call `proxy.url`."""

    def __init__(
        self, upstream: str, *, decide: Callable[[Seen], str | None] | None = None
    ) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port))
        self.decide = decide
        self.seen: list[Seen] = []
        self.faults: dict[str, int] = {}
        self.extra_faults: dict[str, bytes] = {}
        """Fault name -> a raw HTTP response to send as it is (then close)."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0, backlog=1024)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        seen = Seen(method, path, headers, body)
        self.seen.append(seen)
        fault = self.decide(seen) if self.decide is not None else None
        if fault is not None:
            self.faults[fault] = self.faults.get(fault, 0) + 1
        if fault == "reset":
            _reset(writer)
            return
        if fault in self.extra_faults:
            writer.write(self.extra_faults[fault])
            await writer.drain()
            return
        if fault == "html502":
            writer.write(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
                + f"Content-Length: {len(HTML_502)}\r\n".encode()
                + b"Connection: close\r\n\r\n"
                + HTML_502
            )
            await writer.drain()
            return
        if fault == "hang":
            await asyncio.Event().wait()
        await self._forward(lines, body, writer, fault)

    async def _forward(
        self, lines: list[str], body: bytes, writer: asyncio.StreamWriter, fault: str | None
    ) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        try:
            out = [lines[0]]
            out += [ln for ln in lines[1:] if ln and not ln.lower().startswith("connection:")]
            out.append("Connection: close")
            up_writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body)
            await up_writer.drain()
            if fault in ("cut_before_content", "stall_after_headers"):
                head = await up_reader.readuntil(b"\r\n\r\n")
                writer.write(head)
                if fault == "stall_after_headers":
                    while True:
                        writer.write(_chunk(b": keep-alive\n\n"))
                        await writer.drain()
                        await asyncio.sleep(0.05)
                writer.write(_chunk(ROLE_EVENT))
                await writer.drain()
                await asyncio.sleep(0.02)
                _reset(writer)
                return
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            up_writer.close()
            with contextlib.suppress(ConnectionError):
                await up_writer.wait_closed()
