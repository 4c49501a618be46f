"""The HTTP side: a threading server per listener, and the handler that applies faults as it answers."""

from __future__ import annotations

import socket
import struct
import sys
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fakehub.api import Response, error_response
from tests.fakehub.faults import Fault, RequestInfo, RequestRecord, damage

if TYPE_CHECKING:
    from tests.fakehub.hub import FakeHub


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck handler never keeps the interpreter alive
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], hub: FakeHub) -> None:
        self.hub = hub
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # the client went away, or a fault cut the connection
            return
        with self.hub._lock:
            self.hub._errors.append(traceback.format_exc())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        self.timeout = self.server.hub.request_timeout
        super().setup()
        with self.server.hub._lock:
            self.server.hub._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.hub._lock:
            self.server.hub._connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        hub = self.server.hub
        split = urlsplit(self.path)
        query = parse_qs(split.query, keep_blank_values=True)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        info = RequestInfo(method, unquote(split.path), query, self.headers)
        record = RequestRecord(
            method=method,
            path=info.path,
            query=split.query,
            range=self.headers.get("Range"),
            authorization="Authorization" in self.headers,
            port=self.server.server_address[1],
        )
        with hub._lock:
            hub._log.append(record)

        for fault in hub._take_faults(info, body=False):
            record.fault = fault.kind
            if fault.kind == "disconnect":
                return self._cut(fault.params["reset"])
            if fault.kind == "stall":
                hub._stopping.wait(fault.params["seconds"])
                if fault.params["then"] == "drop" or hub._stopping.is_set():
                    return self._cut(False)
            if fault.kind == "status":
                return self._send(self._status_fault(fault.params), record, info)

        try:
            with hub._lock:
                response = hub.route(method, split.path, query, self.headers, body)
        except Exception:
            with hub._lock:
                hub._errors.append(traceback.format_exc())
            response = error_response(500, None, "FakeHub crashed: see hub.server_errors")
        self._send(response, record, info)

    @staticmethod
    def _status_fault(params: dict[str, Any]) -> Response:
        status = params["status"]
        message = params["message"] or f"Injected HTTP {status}"
        extra = dict(params["headers"] or {})
        if params["retry_after"] is not None:
            extra["Retry-After"] = str(params["retry_after"])
        return error_response(status, params["error_code"], message, **extra)

    def _send(self, response: Response, record: RequestRecord, info: RequestInfo) -> None:
        hub = self.server.hub
        record.status = response.status  # before the client can see it: counters never lag behind the client
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(response.length))
        self.send_header("X-Request-Id", f"Root={uuid.uuid4()}")
        self.end_headers()
        if info.method == "HEAD" or response.length == 0:
            return
        faults = [] if 300 <= response.status < 400 else hub._take_faults(info, body=True)
        if faults:
            record.fault = ",".join(filter(None, [record.fault, *(f.kind for f in faults)]))
        self._stream(response, faults, record)

    def _stream(self, response: Response, faults: list[Fault], record: RequestRecord) -> None:
        """Write the body, cutting, corrupting and stalling it where the faults say."""
        hub = self.server.hub
        length = response.length
        cut_at, reset = length + 1, False
        stalls: list[tuple[int, float, bool]] = []  # (offset, seconds, drop after)
        damage_at: list[tuple[int, bytes | None, int]] = []  # (offset, overwrite, flip length)
        rate, slow_until = 0, 0  # a trickle: bytes per second, for the body's first slow_until bytes
        for fault in faults:
            p = fault.params
            if fault.kind == "drop":
                n = p["drop_after"]
                if n == "random":
                    with hub._lock:
                        n = hub._rng.randrange(1, length) if length > 1 else 0
                elif callable(n):
                    n = n(length)
                if n < cut_at:
                    cut_at, reset = int(n), p["reset"]
            elif fault.kind == "stall":
                stalls.append((p["after"], p["seconds"], p["then"] == "drop"))
            elif fault.kind == "trickle":
                rate, slow_until = int(p["rate"]), length if p["for_bytes"] is None else int(p["for_bytes"])
            else:
                damage_at.append((p["offset"], p["data"], p["length"]))
        stalls.sort()

        position = 0
        for chunk in response.chunks():
            while chunk:
                if stalls and stalls[0][0] <= position:
                    _, seconds, then_drop = stalls.pop(0)
                    hub._stopping.wait(seconds)
                    if then_drop or hub._stopping.is_set():
                        return self._cut(False)
                    continue
                if position >= cut_at:
                    return self._cut(reset)
                stop = min(len(chunk), cut_at - position, (stalls[0][0] - position) if stalls else len(chunk))
                slow = rate > 0 and position < slow_until
                if slow:  # a tenth of a second's worth at a time
                    stop = min(stop, max(1, rate // 10), slow_until - position)
                piece, chunk = chunk[:stop], chunk[stop:]
                if damage_at:
                    piece = damage(piece, position, damage_at)
                with hub._lock:
                    record.bytes_sent += len(piece)  # counted before it is written, for the same reason
                self.wfile.write(piece)
                position += len(piece)
                if slow:
                    self.wfile.flush()
                    if hub._stopping.wait(len(piece) / rate):
                        return self._cut(False)
        if position >= cut_at:
            self._cut(reset)

    def _cut(self, reset: bool) -> None:
        """End the connection mid-response: a FIN (the client sees a short body) or, with `reset`, an RST."""
        self.close_connection = True
        try:
            if reset:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
