"""A real HTTP server on 127.0.0.1 for model-download tests (Range requests, scripted faults)."""

from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path

from vcam.models import registry
from vcam.models.download import crc32_text


class ModelServer:
    """Serves files from ``root`` at /{base}/{file}, with Range support and scripted faults.

    ``faults[path]``: "cut" (first response stops after half the body), "500", "404", "ignore-range".
    ``log``: (path, Range header or None) of every GET.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.faults: dict[str, str] = {}
        self.log: list[tuple[str, str | None]] = []
        self.cut_at: dict[str, int] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.log.append((self.path, rng))
                fault = server.faults.get(self.path)
                if fault in ("404", "500"):
                    self.send_response(int(fault))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = server.root / self.path.lstrip("/")
                if not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = path.read_bytes()
                start = 0
                if rng and fault != "ignore-range":
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if fault == "cut":
                    server.faults.pop(self.path)
                    half = len(body) // 2
                    server.cut_at[self.path] = half
                    self.wfile.write(body[:half])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def template(self) -> str:
        return f"http://127.0.0.1:{self.port}/{{base}}/{{file}}"

    def publish(self, name: str, data: bytes, *, crc: str | None = None) -> str:
        spec = registry.get(name)
        folder = self.root / spec.base
        folder.mkdir(parents=True, exist_ok=True)
        (folder / spec.file).write_bytes(data)
        (folder / spec.hash_file).write_text(crc or crc32_text(data))
        return f"/{spec.base}/{spec.file}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
