"""A small HTTP/1.1 server whose every resource is bounded, for the result ingest.

Trial pods are code the operator does not trust, on a network it does not own, so
the endpoint they post to must not be holdable: a full library server (aiohttp)
has no deadline on reading a request's headers or body, and 200 half-sent
requests were still held after 150 s.  Here each connection carries exactly one
request (``Connection: close``) and:

- its request line and headers must arrive within ``header_timeout_s`` of the
  connection opening and fit in ``MAX_HEADER_BYTES`` (else 408 / 431, closed);
- its body must be announced by ``Content-Length`` (no chunked encoding: 411),
  be at most ``max_body_bytes`` (413, not read) and arrive within
  ``body_timeout_s`` once the headers are in (408, closed);
- at most ``max_connections`` are open at once, and at most ``max_per_client``
  from one source address (a pod has one): one more is closed unanswered.  So a
  pod flooding the endpoint with idle connections holds a few slots, never the
  ones other trials' pods post through; each of its connections still ends
  within the header timeout.

``handler(method, path, headers, read_body)`` decides: it sees the headers first, so
it can refuse (e.g. a bad token) before a byte of the body is read; ``read_body()``
reads it within the deadline.  It returns (status, JSON-able answer, extra headers).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from typing import Any, Awaitable, Callable, Mapping

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 << 10
HEADER_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 256
MAX_PER_CLIENT = 16       # a pod posts one result at a time (trainable/pod_session.py); 16 is ample

_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 409: "Conflict", 410: "Gone", 411: "Length Required",
            413: "Payload Too Large", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}

Answer = tuple[int, Any, Mapping[str, str]]
Handler = Callable[[str, str, Mapping[str, str], Callable[[], Awaitable[bytes]]], Awaitable[Answer]]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BoundedHttpServer:
    def __init__(self, handler: Handler, *, host: str, port: int, max_body_bytes: int,
                 header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, max_per_client: int = MAX_PER_CLIENT) -> None:
        self._handler = handler
        self.host, self.port = host, port
        self.max_body_bytes = max_body_bytes
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self._open = 0                      # connections held now (touched by the server's thread only)
        self._by_client: dict[str, int] = {}   # source address -> its connections held now
        self.refused = 0                    # connections closed unanswered for a limit
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        """Listen, on an event loop of its own in its own thread: however busy the endpoint
        is, the operator's loop (every controller) is not the one serving it."""
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="kubetune-ingest", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(ready)     # an OSError (port taken) is raised here

    def _run(self, ready: concurrent.futures.Future) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve, self.host, self.port, limit=MAX_HEADER_BYTES))
        except BaseException as error:  # noqa: BLE001 - handed to start()
            loop.close()
            ready.set_exception(error)
            return
        if self.port == 0:   # an ephemeral port: say which one
            self.port = self._server.sockets[0].getsockname()[1]
        self._loop = loop
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:   # close held connections with the loop, not after it
            self._server.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, 10)
            self._loop = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self._open >= self.max_connections or self._by_client.get(client, 0) >= self.max_per_client:
            self.refused += 1
            writer.transport.abort()
            return
        self._open += 1
        self._by_client[client] = self._by_client.get(client, 0) + 1
        try:
            await self._one_request(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:   # the server stops: the connection goes with it
            pass
        except Exception:  # noqa: BLE001 - one bad request must not end the server
            log.exception("ingest request failed")
        finally:
            self._open -= 1
            self._by_client[client] -= 1
            if not self._by_client[client]:
                del self._by_client[client]
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            method, path, headers = await asyncio.wait_for(_read_head(reader), self.header_timeout_s)
        except asyncio.TimeoutError:
            await _respond(writer, 408, {"error": f"request headers not received within {self.header_timeout_s:g}s"})
            return
        except HttpError as error:
            await _respond(writer, error.status, {"error": str(error)})
            return

        async def read_body() -> bytes:
            if "transfer-encoding" in headers:
                raise HttpError(411, "send the body with Content-Length, not chunked")
            length = headers.get("content-length", "")
            if not length.isdigit():
                raise HttpError(411, "Content-Length required")
            if int(length) > self.max_body_bytes:
                raise HttpError(413, f"the body is {length} bytes; at most {self.max_body_bytes} accepted")
            if headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                return await asyncio.wait_for(reader.readexactly(int(length)), self.body_timeout_s)
            except asyncio.TimeoutError:
                raise HttpError(408, f"the body was not received within {self.body_timeout_s:g}s") from None

        try:
            status, answer, extra = await self._handler(method, path, headers, read_body)
        except HttpError as error:
            status, answer, extra = error.status, {"error": str(error)}, {}
        await _respond(writer, status, answer, extra)


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"request line and headers exceed {MAX_HEADER_BYTES} bytes") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "not an HTTP/1.x request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, colon, value = line.partition(":")
            if not colon:
                raise HttpError(400, f"malformed header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


async def _respond(writer: asyncio.StreamWriter, status: int, answer: Any,
                   extra: Mapping[str, str] | None = None) -> None:
    body = json.dumps(answer).encode()
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in (extra or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
    try:   # a client that does not read its answer cannot hold the connection either
        await asyncio.wait_for(writer.drain(), HEADER_TIMEOUT_S)
    except asyncio.TimeoutError:
        writer.transport.abort()
