"""A tiny real HTTP proxy in front of the real kube-apiserver that answers some
requests itself, with the API server's own Status bodies: ``429 TooManyRequests`` as
a loaded API server's priority and fairness does, or ``422 Invalid`` as a validating
admission webhook may: API errors injected honestly, with no mock of the client.

The operator is pointed at it with a kubeconfig (plain HTTP on localhost); the proxy
forwards everything else to the test control plane with the admin credentials,
streaming responses so watches work through it."""
from __future__ import annotations

import asyncio
import json
import ssl
import threading
from pathlib import Path
from typing import Callable

import yaml
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from kubetune.devcluster.processes import free_port

__all__ = ["FlakyApiServer"]

REASONS = {429: "TooManyRequests", 422: "Invalid", 403: "Forbidden", 500: "InternalError"}
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


class FlakyApiServer:
    def __init__(self, kubeconfig: Path, workdir: Path, fail: Callable[[str, str], int | None]) -> None:
        """``fail(method, path)`` says how to refuse this request: 429 (the API server's
        TooManyRequests), 422 (Invalid), or None to forward it."""
        self._kubeconfig = kubeconfig
        self._workdir = workdir
        self._fail = fail
        self.refused = 0
        self.forwarded = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def start(self) -> Path:
        """Start serving; returns the kubeconfig that points at the proxy."""
        from kubernetes import client, config
        upstream = client.Configuration()
        config.load_kube_config(str(self._kubeconfig), client_configuration=upstream)
        self._server = upstream.host
        context = ssl.create_default_context(cafile=upstream.ssl_ca_cert)
        context.load_cert_chain(upstream.cert_file, upstream.key_file)
        self._ssl = context
        self.port = free_port()
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the flaky API proxy did not start")
        path = self._workdir / "flaky-kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "flaky",
            "clusters": [{"name": "flaky", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "flaky", "user": {}}],
            "contexts": [{"name": "flaky", "context": {"cluster": "flaky", "user": "flaky"}}]}))
        return path

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    # ------------------------------------------------------------------ serving

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start(ready))
        self._loop.run_forever()

    async def _start(self, ready: threading.Event) -> None:
        self._session = ClientSession(connector=TCPConnector(ssl=self._ssl, limit=0),
                                      timeout=ClientTimeout(total=None, sock_read=None), auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._handle)
        # open watches are cut at shutdown, not waited for
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        ready.set()

    async def _shutdown(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        code = self._fail(request.method, request.path)
        if code:
            self.refused += 1
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                      "reason": REASONS[code], "message": "injected by the test's flaky API proxy"}
            return web.Response(status=code, text=json.dumps(status), content_type="application/json",
                                headers={"Retry-After": "1"} if code == 429 else {})
        self.forwarded += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        # the Kubernetes client sends no Content-Type (the API server takes JSON then):
        # aiohttp must not add its application/octet-stream
        async with self._session.request(request.method, self._server + request.path_qs, headers=headers,
                                         data=body or None, skip_auto_headers=("Content-Type",)) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
