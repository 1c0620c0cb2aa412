"""A real HTTP server on loopback that records the POSTs it receives (the admin's webhook in tests).

``answers`` is the queue of status codes it answers with, one per request (then 200), so a
test can make the first delivery fail and see the hub retry.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.ports import free_port


class WebhookReceiver:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks/gpulab"
        self.received: list[dict[str, Any]] = []
        self.answers: list[int] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with receiver._lock:
                    status = receiver.answers.pop(0) if receiver.answers else 200
                    receiver.received.append(
                        {
                            "path": self.path,
                            "content_type": self.headers.get("Content-Type"),
                            "status": status,
                            "body": json.loads(raw) if raw else None,
                        }
                    )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def delivered(self) -> list[dict[str, Any]]:
        """The bodies it answered 2xx to."""
        with self._lock:
            return [r["body"] for r in self.received if 200 <= r["status"] < 300]
