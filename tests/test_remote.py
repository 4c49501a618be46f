"""The ggml-rpc handshake against loopback servers written here: byte layout, versions, every failure's line.

Each fake server serves its clients one at a time in a thread, like a ggml-rpc worker, on a free
127.0.0.1 port. No test needs llama.cpp or a real worker.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.metadata
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from runner import remote
from runner.errors import InvalidSetting, WorkerError, exit_code_for

pytestmark = pytest.mark.fast

HELLO = struct.pack("<BQ", 14, 24) + bytes(24)  # cmd 14, size 24, conn_caps all zero
DEVICE_COUNT = struct.pack("<BQ", 15, 0)


def hello_answer(major: int, minor: int, patch: int) -> bytes:
    return struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24)


def device_memory(device: int) -> bytes:
    return struct.pack("<BQI", 11, 4, device)


def answer(fmt: str, *values: int) -> bytes:
    body = struct.pack(fmt, *values)
    return struct.pack("<Q", len(body)) + body


class FakeServer:
    """A loopback TCP server that runs `handle(conn)` for each client, one after another, in a thread."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.handle = handle
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self.handle(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket], None]], FakeServer]]:
    servers: list[FakeServer] = []

    def start(handle: Callable[[socket.socket], None]) -> FakeServer:
        servers.append(FakeServer(handle))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def scripted(steps: list[tuple[bytes, bytes]], received: list[bytes]) -> Callable[[socket.socket], None]:
    """Per (request, answer): read as many bytes as the request has, record them, answer if they match."""

    def handle(conn: socket.socket) -> None:
        for expected, reply in steps:
            got = recv_exactly(conn, len(expected))
            received.append(got)
            if got != expected:
                return
            conn.sendall(reply)
        recv_exactly(conn, 1)  # until the client closes

    return handle


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def silent(stop: threading.Event) -> Callable[[socket.socket], None]:
    """Accepts and never answers: the line a busy worker keeps its next client waiting in."""
    return lambda conn: stop.wait(10)


def probe_error(endpoint: str, timeout: float = remote.HANDSHAKE_TIMEOUT_S) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        remote.probe(endpoint, timeout)
    message = str(info.value)
    assert "\n" not in message and endpoint in message
    return message, time.monotonic() - start


# --- parse_endpoints -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:50052", ["127.0.0.1:50052"]),
        ("10.0.0.2:50052,10.0.0.3:50053", ["10.0.0.2:50052", "10.0.0.3:50053"]),
        (" gpu-box.local:1 ,  Other.Example.com:65535 ", ["gpu-box.local:1", "other.example.com:65535"]),
        ("localhost:050052,rpc_worker:7", ["localhost:50052", "rpc_worker:7"]),
    ],
)
def test_parse_endpoints_accepts(text: str, expected: list[str]) -> None:
    assert remote.parse_endpoints(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("localhost", '"localhost" has no port; write HOST:PORT, e.g. 127.0.0.1:50052'),
        ("localhost:", '"localhost:" has no port'),
        ("", "no worker given"),
        ("  ", "no worker given"),
        ("a:1,,b:2", 'an empty item in "a:1,,b:2"'),
        ("a:1,", "an empty item"),
        ("a:1, a:1", '"a:1" is given twice'),
        ("a:0", 'has port "0"; a port is a number 1..65535'),
        ("a:65536", 'has port "65536"'),
        ("a:http", 'has port "http"'),
        ("a:-1", 'has port "-1"'),
        ("::1:50052", "is an IPv6 endpoint, which this llama.cpp's RPC client cannot reach"),
        ("[::1]:50052", "is an IPv6 endpoint"),
        ("[::1", "is an IPv6 endpoint"),
        ("bad host:1", '"bad host:1" has no valid host name'),
        ("999.1.1.1:1", "no valid host name or IPv4 address"),
        ("-a:1", "no valid host name"),
        (",".join(f"10.0.0.{i}:50052" for i in range(17)), "17 workers given; llama.cpp takes at most 16"),
    ],
)
def test_parse_endpoints_rejects_with_the_flag_and_the_item(text: str, says: str) -> None:
    with pytest.raises(InvalidSetting) as info:
        remote.parse_endpoints(text, flag="--workers")
    message = str(info.value)
    assert message.startswith("--workers: ") and says in message and "\n" not in message
    assert exit_code_for(info.value) == 2


def test_parse_endpoints_takes_sixteen() -> None:
    text = ",".join(f"10.0.0.{i}:50052" for i in range(remote.MAX_WORKERS))
    assert len(remote.parse_endpoints(text)) == 16


# --- probe: a worker --------------------------------------------------------------------------------


def test_probe_reads_version_and_each_device(serve: Callable[..., FakeServer]) -> None:
    received: list[bytes] = []
    steps = [
        (HELLO, hello_answer(7, 0, 0)),
        (DEVICE_COUNT, answer("<I", 2)),
        (device_memory(0), answer("<QQ", 3 << 30, 8 << 30)),
        (device_memory(1), answer("<QQ", 5 << 30, 16 << 30)),
    ]
    server = serve(scripted(steps, received))
    worker = remote.probe(server.endpoint)
    assert received == [request for request, _ in steps]  # the exact bytes of each request
    assert worker == remote.Worker(
        server.endpoint,
        (7, 0, 0),
        (remote.DeviceMemory(3 << 30, 8 << 30), remote.DeviceMemory(5 << 30, 16 << 30)),
    )
    assert (worker.free_bytes, worker.total_bytes) == (8 << 30, 24 << 30)


def test_request_layout_is_packed_little_endian() -> None:
    """The three requests, spelled out byte by byte (ggml-rpc.cpp: cmd u8, size u64, then the struct)."""
    assert HELLO == b"\x0e" + b"\x18\x00\x00\x00\x00\x00\x00\x00" + b"\x00" * 24
    assert DEVICE_COUNT == b"\x0f" + b"\x00" * 8
    assert device_memory(1) == b"\x0b" + b"\x04" + b"\x00" * 7 + b"\x01\x00\x00\x00"


def test_a_later_patch_is_accepted(serve: Callable[..., FakeServer]) -> None:
    steps = [
        (HELLO, hello_answer(7, 0, 9)),
        (DEVICE_COUNT, answer("<I", 1)),
        (device_memory(0), answer("<QQ", 1, 2)),
    ]
    server = serve(scripted(steps, []))
    assert remote.probe(server.endpoint).version == (7, 0, 9)


def test_reachable(serve: Callable[..., FakeServer]) -> None:
    steps = [
        (HELLO, hello_answer(7, 0, 0)),
        (DEVICE_COUNT, answer("<I", 1)),
        (device_memory(0), answer("<QQ", 1, 2)),
    ]
    server = serve(scripted(steps, []))
    assert remote.reachable(server.endpoint) is True
    assert remote.reachable(f"127.0.0.1:{free_port()}") is False


# --- probe: each failure, one line --------------------------------------------------------------------


def test_closed_port_is_refused_at_once() -> None:
    port = free_port()
    message, elapsed = probe_error(f"127.0.0.1:{port}")
    assert message == (
        f"no worker at 127.0.0.1:{port} (connection refused): "
        f"start one there with `runner worker --port {port}`"
    )
    assert elapsed < 3
    assert exit_code_for(WorkerError(message)) == 1


def test_a_host_that_does_not_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    def gaierror(host: str) -> str:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(remote.socket, "gethostbyname", gaierror)
    message, _ = probe_error("nosuchhost:50052")
    assert message == "cannot resolve the host of worker nosuchhost:50052"


def test_a_lookup_that_hangs_is_abandoned_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote.socket, "gethostbyname", lambda host: time.sleep(3) or "127.0.0.1")
    message, elapsed = probe_error("slowdns:50052", timeout=0.5)
    assert message == "cannot resolve the host of worker slowdns:50052 within 0.5 s"
    assert elapsed < 1.5


def test_a_server_that_never_answers(serve: Callable[..., FakeServer]) -> None:
    stop = threading.Event()
    server = serve(silent(stop))
    message, elapsed = probe_error(server.endpoint, timeout=1.0)
    stop.set()
    assert message.startswith(
        f"worker {server.endpoint} accepted the connection but did not answer within 1 s "
        "(a worker serves one client at a time: is another runner using it?"
    )
    assert 0.9 < elapsed < 2.0


def test_a_probe_that_gives_up_resets_the_connection(serve: Callable[..., FakeServer]) -> None:
    """A busy worker answers our queued HELLO later: after a FIN that write would SIGPIPE a C++ rpc-server."""
    stop, outcome = threading.Event(), []

    def late_worker(conn: socket.socket) -> None:
        stop.wait(10)  # "busy with another client" until the probe has given up
        try:
            outcome.append(recv_exactly(conn, len(HELLO)))
            conn.sendall(hello_answer(7, 0, 0))
            outcome.append(conn.recv(1))
        except ConnectionResetError:
            outcome.append("reset")

    server = serve(late_worker)
    probe_error(server.endpoint, timeout=0.5)
    stop.set()
    server.close()
    assert outcome[-1] == "reset"


def test_an_http_server_that_waits_for_a_request_line(serve: Callable[..., FakeServer]) -> None:
    """http.server reads up to a newline, which a binary HELLO never sends: silence, then the hint."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        message, elapsed = probe_error(f"127.0.0.1:{httpd.server_address[1]}", timeout=1.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert "did not answer within 1 s" in message and "Or is this no worker at all?" in message
    assert elapsed < 2.0


def test_an_http_server_that_answers_at_once(serve: Callable[..., FakeServer]) -> None:
    def http_400(conn: socket.socket) -> None:
        conn.recv(64)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    server = serve(http_400)
    message, elapsed = probe_error(server.endpoint)
    assert message == f'{server.endpoint} is not a ggml-rpc worker (it answered "HTTP/1.1 400 Bad Request…")'
    assert elapsed < 1


def test_binary_garbage_is_shown_as_hex(serve: Callable[..., FakeServer]) -> None:
    server = serve(lambda conn: conn.sendall(bytes(range(1, 17))))
    message, _ = probe_error(server.endpoint)
    assert (
        message == f"{server.endpoint} is not a ggml-rpc worker (it answered bytes 01 02 03 04 05 06 07 08 …)"
    )


def test_a_server_that_hangs_up(serve: Callable[..., FakeServer]) -> None:
    server = serve(lambda conn: conn.recv(64))
    message, elapsed = probe_error(server.endpoint)
    assert message.startswith(f"{server.endpoint} is not a ggml-rpc worker (it closed the connection")
    assert elapsed < 1


@pytest.mark.parametrize(("major", "minor", "patch"), [(6, 1, 0), (7, 1, 0), (8, 0, 0)])
def test_another_protocol_version(
    serve: Callable[..., FakeServer], major: int, minor: int, patch: int
) -> None:
    server = serve(scripted([(HELLO, hello_answer(major, minor, patch))], []))
    message, _ = probe_error(server.endpoint)
    assert message == (
        f"worker {server.endpoint} speaks ggml-rpc {major}.{minor}.{patch}; this llama.cpp speaks 7.0.x: "
        f"run the same llama.cpp (llama-cpp-python {remote.LLAMA_CPP_PYTHON}) on both"
    )


@pytest.mark.parametrize(
    ("count", "says"),
    [(0, "has no devices to offer"), (17, "is not a ggml-rpc worker (it reported 17 devices)")],
)
def test_device_count_out_of_range(serve: Callable[..., FakeServer], count: int, says: str) -> None:
    server = serve(scripted([(HELLO, hello_answer(7, 0, 0)), (DEVICE_COUNT, answer("<I", count))], []))
    message, _ = probe_error(server.endpoint)
    assert says in message


def test_a_response_of_the_wrong_size(serve: Callable[..., FakeServer]) -> None:
    steps = [
        (HELLO, hello_answer(7, 0, 0)),
        (DEVICE_COUNT, answer("<I", 1)),
        (device_memory(0), answer("<Q", 1)),
    ]
    server = serve(scripted(steps, []))
    message, _ = probe_error(server.endpoint)
    assert message.startswith(f"{server.endpoint} is not a ggml-rpc worker (it answered ")


def test_a_worker_that_goes_away_after_hello(serve: Callable[..., FakeServer]) -> None:
    def hello_then_hang_up(conn: socket.socket) -> None:
        recv_exactly(conn, len(HELLO))
        conn.sendall(hello_answer(7, 0, 0))

    server = serve(hello_then_hang_up)
    message, _ = probe_error(server.endpoint)
    assert message == f"worker {server.endpoint} went away during the handshake (it closed the connection)"


# --- probe_all ---------------------------------------------------------------------------------------


def test_probe_all_waits_for_all_at_once(serve: Callable[..., FakeServer]) -> None:
    stop = threading.Event()
    first, second = serve(silent(stop)), serve(silent(stop))
    start = time.monotonic()
    with pytest.raises(WorkerError, match="did not answer within 1 s") as info:
        remote.probe_all([first.endpoint, second.endpoint], timeout=1.0)
    stop.set()
    assert time.monotonic() - start < 1.8
    assert first.endpoint in str(info.value)  # the first error in endpoint order


def test_probe_all_keeps_the_order_and_raises_the_first_error(serve: Callable[..., FakeServer]) -> None:
    def worker(free: int) -> Callable[[socket.socket], None]:
        steps = [
            (HELLO, hello_answer(7, 0, 0)),
            (DEVICE_COUNT, answer("<I", 1)),
            (device_memory(0), answer("<QQ", free, 99)),
        ]
        return scripted(steps, [])

    one, two = serve(worker(1)), serve(worker(2))
    assert [w.free_bytes for w in remote.probe_all([two.endpoint, one.endpoint])] == [2, 1]
    closed = f"127.0.0.1:{free_port()}"
    with pytest.raises(WorkerError, match=f"no worker at {closed}"):
        remote.probe_all([one.endpoint, closed, two.endpoint])
    assert remote.probe_all([]) == []


def test_the_protocol_constants_match_the_installed_llama_cpp() -> None:
    """PROTO_* come from llama-cpp-python LLAMA_CPP_PYTHON's ggml-rpc.h: an upgrade must re-read them."""
    try:
        installed = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llama-cpp-python is not installed")
    assert installed == remote.LLAMA_CPP_PYTHON
