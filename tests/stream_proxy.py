"""A TCP proxy in front of a real vLLM server for the fault tests: it passes bytes through, and can cut a
streamed response after some server-sent events, slow each event down, or terminate TLS (a self-signed
certificate). The server behind it is the real one; only the path to the client misbehaves, as a broken load
balancer, a slow network or a TLS front end would.

Events are what vLLM's streams separate with a blank line ("\\n\\n"); JSON answers (/v1/models, /tpcomm/v1/*,
/health) hold none, so only token streams are cut or slowed.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
from pathlib import Path


class StreamProxy:
    def __init__(
        self,
        upstream_port: int,
        cut_after: int | None = None,
        delay_s: float = 0.0,
        tls: ssl.SSLContext | None = None,
    ):
        self.upstream_port, self.cut_after, self.delay_s, self.tls = upstream_port, cut_after, delay_s, tls
        self.port = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> StreamProxy:
        self._thread.start()
        assert self._ready.wait(10), "proxy did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cwriter.close()
            return

        async def up() -> None:
            while data := await creader.read(65536):
                uwriter.write(data)
                await uwriter.drain()
            uwriter.close()

        async def down() -> None:
            events = 0
            while data := await ureader.read(65536):
                parts = data.split(b"\n\n")
                for i, part in enumerate(parts):
                    last = i == len(parts) - 1
                    cwriter.write(part if last else part + b"\n\n")
                    await cwriter.drain()
                    if last:
                        continue
                    events += 1
                    if self.cut_after is not None and events >= self.cut_after:
                        self.cuts += 1
                        raise ConnectionAbortedError  # closes both sides mid-stream
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
            cwriter.close()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel()
            for w in (cwriter, uwriter):
                try:
                    w.transport.abort()
                except Exception:  # noqa: BLE001 - already closed
                    pass


def self_signed(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """(certificate file, server TLS context) for 127.0.0.1, made with the openssl command."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return cert, ctx
