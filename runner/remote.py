"""The handshake of llama.cpp's RPC backend (ggml-rpc), spoken by runner itself before it loads a model.

Why: ggml's own client aborts the whole process (GGML_ABORT, ggml-rpc.cpp `rpc_dispatcher::start`) when
it cannot parse an endpoint, connect to it, or agree on a version, and it waits with no timeout. So
runner checks every worker endpoint first, before one deadline, and turns each failure into one line
that names the endpoint. A worker serves one client at a time (the next connection is accepted by the
kernel and then waits unanswered), so each probe closes its connection at the end; see `_reset` for
how a probe that gives up closes it.

The wire format, from vendor/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp and ggml/include/ggml-rpc.h of
llama-cpp-python 0.3.36 (packed structs, little-endian):

    request:  | cmd: u8 | request_size: u64 | request_data |
    response: | response_size: u64 | response_data |

    RPC_CMD_HELLO = 14 (always the first command on a connection)
        rpc_msg_hello_req { u8 conn_caps[24] }                  all zero: plain TCP, no RDMA
        rpc_msg_hello_rsp { u8 major, minor, patch, padding; u8 conn_caps[24] }     28 bytes
    RPC_CMD_DEVICE_COUNT = 15: no request data; rpc_msg_device_count_rsp { u32 device_count }
    RPC_CMD_GET_DEVICE_MEMORY = 11
        rpc_msg_get_device_memory_req { u32 device }
        rpc_msg_get_device_memory_rsp { u64 free_mem, total_mem }

ggml's client accepts a server whose major equals RPC_PROTO_MAJOR_VERSION and whose minor is at most
RPC_PROTO_MINOR_VERSION; so does `probe`. Like ggml's client (transport.cpp `socket_t::connect`:
gethostbyname, AF_INET), a host name is resolved to an IPv4 address. ggml's client also splits an
endpoint at its first ":" (`parse_endpoint`), so `parse_endpoints` refuses IPv6 endpoints.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from runner.errors import InvalidSetting, WorkerError

DEFAULT_PORT = 50052
PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH = 7, 0, 0  # RPC_PROTO_*_VERSION in ggml-rpc.h
LLAMA_CPP_PYTHON = "0.3.36"  # the build those numbers come from; tests/test_remote.py checks it is installed
HANDSHAKE_TIMEOUT_S = 3.0
MAX_WORKERS = 16  # GGML_RPC_MAX_SERVERS

_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
_CONN_CAPS_SIZE = 24
_MAX_DEVICES = 16  # more from one worker is garbage, not a machine

_REQUEST_HEADER = struct.Struct("<BQ")  # cmd, request_size: 9 bytes
_RESPONSE_SIZE = struct.Struct("<Q")
_HELLO_RSP = struct.Struct(f"<BBBB{_CONN_CAPS_SIZE}s")  # 28 bytes
_DEVICE_COUNT_RSP = struct.Struct("<I")
_DEVICE_MEMORY_REQ = struct.Struct("<I")
_DEVICE_MEMORY_RSP = struct.Struct("<QQ")

_SHOWN_CHARS = 24  # of what a peer that is not a worker answered


@dataclass(frozen=True)
class DeviceMemory:
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Worker:
    """A worker that answered the handshake: its protocol version and each device's memory."""

    endpoint: str  # "host:port" as the user gave it (normalized)
    version: tuple[int, int, int]
    devices: tuple[DeviceMemory, ...]

    @property
    def free_bytes(self) -> int:
        return sum(d.free_bytes for d in self.devices)

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)


def parse_endpoints(text: str, flag: str = "--rpc") -> list[str]:
    """ "HOST:PORT[,HOST:PORT...]" -> normalized endpoints, in order; InvalidSetting names the bad item."""
    if not text.strip():
        raise InvalidSetting(
            f"{flag}: no worker given; write HOST:PORT[,HOST:PORT...], e.g. 127.0.0.1:{DEFAULT_PORT}"
        )
    endpoints: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise InvalidSetting(
                f'{flag}: an empty item in "{text.strip()}"; separate endpoints with one comma'
            )
        endpoint = _parse_one(item, flag)
        if endpoint in endpoints:
            raise InvalidSetting(f'{flag}: "{item}" is given twice')
        endpoints.append(endpoint)
    if len(endpoints) > MAX_WORKERS:
        raise InvalidSetting(f"{flag}: {len(endpoints)} workers given; llama.cpp takes at most {MAX_WORKERS}")
    return endpoints


def _parse_one(item: str, flag: str) -> str:
    """One "HOST:PORT" -> "host:port" (host lowercased, port as a plain number)."""
    example = f"write HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}"
    if item.startswith("[") or item.count(":") > 1:  # ggml's client splits at the first ":", IPv4 only
        raise InvalidSetting(
            f'{flag}: "{item}" is an IPv6 endpoint, which this llama.cpp\'s RPC client cannot reach; '
            "use an IPv4 address or a host name"
        )
    host, colon, port_text = item.rpartition(":")
    if not colon or not port_text:
        raise InvalidSetting(f'{flag}: "{item}" has no port; {example}')
    if not _is_host(host):
        raise InvalidSetting(f'{flag}: "{item}" has no valid host name or IPv4 address before its port')
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise InvalidSetting(f'{flag}: "{item}" has port "{port_text}"; a port is a number 1..65535')
    return f"{host.lower()}:{int(port_text)}"


def _is_host(host: str) -> bool:
    """A host name (RFC 1123 labels, and "_" as container names have) or an IPv4 address."""
    if not host or len(host) > 253:
        return False
    if all(c.isdigit() or c == "." for c in host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    labels = host.split(".")
    return all(
        0 < len(label) <= 63
        and label.isascii()
        and not label.startswith("-")
        and not label.endswith("-")
        and all(c.isalnum() or c in "-_" for c in label)
        for label in labels
    )


def probe(endpoint: str, timeout: float = HANDSHAKE_TIMEOUT_S) -> Worker:
    """HELLO, DEVICE_COUNT and each device's memory from one worker, all within `timeout` seconds."""
    endpoint = _parse_one(endpoint.strip(), "worker")
    host, port = _split(endpoint)
    deadline = time.monotonic() + timeout
    family, address = _resolve(endpoint, host, port, deadline, timeout)
    sock = _connect(endpoint, port, family, address, deadline, timeout)
    try:
        conn = _Connection(sock, endpoint, deadline, timeout)
        major, minor, patch, _, _ = conn.call(_CMD_HELLO, bytes(_CONN_CAPS_SIZE), _HELLO_RSP)
        if major != PROTO_MAJOR or minor > PROTO_MINOR:
            raise WorkerError(
                f"worker {endpoint} speaks ggml-rpc {major}.{minor}.{patch}; this llama.cpp speaks "
                f"{PROTO_MAJOR}.{PROTO_MINOR}.x: run the same llama.cpp "
                f"(llama-cpp-python {LLAMA_CPP_PYTHON}) on both"
            )
        (count,) = conn.call(_CMD_DEVICE_COUNT, b"", _DEVICE_COUNT_RSP)
        if count > _MAX_DEVICES:
            raise WorkerError(f"{endpoint} is not a ggml-rpc worker (it reported {count} devices)")
        if count == 0:
            raise WorkerError(f"worker {endpoint} has no devices to offer")
        devices = tuple(
            DeviceMemory(*conn.call(_CMD_GET_DEVICE_MEMORY, _DEVICE_MEMORY_REQ.pack(i), _DEVICE_MEMORY_RSP))
            for i in range(count)
        )
    except BaseException:
        _reset(sock)
        raise
    sock.close()  # between commands: the worker reads the end of the stream and serves its next client
    return Worker(endpoint, (major, minor, patch), devices)


def probe_all(endpoints: list[str], timeout: float = HANDSHAKE_TIMEOUT_S) -> list[Worker]:
    """probe() every endpoint at once (~timeout in all, not one each); raises the first error in order."""
    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=len(endpoints), thread_name_prefix="runner-probe") as pool:
        futures = [pool.submit(probe, endpoint, timeout) for endpoint in endpoints]
    return [future.result() for future in futures]


def reachable(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether a worker of this protocol answers there (probe() that returns False instead of raising)."""
    try:
        probe(endpoint, timeout)
    except WorkerError:
        return False
    return True


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def _seconds(timeout: float) -> str:
    return f"{timeout:g} s"


def _resolve(
    endpoint: str, host: str, port: int, deadline: float, timeout: float
) -> tuple[socket.AddressFamily, tuple[str, int]]:
    """The address ggml would connect to; a lookup that hangs is abandoned at the deadline."""
    if ":" in host:
        return socket.AF_INET6, (host, port)
    found: list[str] = []
    lookup = threading.Thread(target=lambda: found.append(_gethostbyname(host)), daemon=True)
    lookup.start()
    lookup.join(max(deadline - time.monotonic(), 0.0))
    if lookup.is_alive():
        raise WorkerError(f"cannot resolve the host of worker {endpoint} within {_seconds(timeout)}")
    if not found or not found[0]:
        raise WorkerError(f"cannot resolve the host of worker {endpoint}")
    return socket.AF_INET, (found[0], port)


def _gethostbyname(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:  # socket.gaierror, socket.herror
        return ""


def _reset(sock: socket.socket) -> None:
    """Close with a reset (RST), not an end of stream (FIN), when a request may still be unanswered.

    A busy worker has our HELLO queued; it reads it when its client leaves and writes the answer. To a
    peer that sent FIN and then went away, that write raises SIGPIPE, which kills a C++ rpc-server (it
    does not ignore the signal). After a reset the write fails with ECONNRESET, and the worker carries on.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _connect(
    endpoint: str,
    port: int,
    family: socket.AddressFamily,
    address: tuple[str, int],
    deadline: float,
    timeout: float,
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.connect(address)
    except ConnectionRefusedError:
        sock.close()
        raise WorkerError(
            f"no worker at {endpoint} (connection refused): "
            f"start one there with `runner worker --port {port}`"
        ) from None
    except TimeoutError:  # socket.timeout
        sock.close()
        raise WorkerError(
            f"worker {endpoint} did not accept a connection within {_seconds(timeout)}"
        ) from None
    except OSError as exc:
        sock.close()
        raise WorkerError(f"cannot reach worker {endpoint}: {exc.strerror or exc}") from None
    return sock


class _Connection:
    """One connection's commands before one deadline, each reading exactly the size its struct has."""

    def __init__(self, sock: socket.socket, endpoint: str, deadline: float, timeout: float) -> None:
        self.sock, self.endpoint, self.deadline, self.timeout = sock, endpoint, deadline, timeout
        self.received = bytearray()  # of the current response, for the message if it is not ggml-rpc
        self.answered = False  # a whole response came back on this connection

    def call(self, cmd: int, request: bytes, response: struct.Struct) -> tuple[int, ...]:
        self.received.clear()
        self._send(_REQUEST_HEADER.pack(cmd, len(request)) + request)
        (size,) = _RESPONSE_SIZE.unpack(self._recv(_RESPONSE_SIZE.size))
        if size != response.size:
            self._read_a_little_more()
            raise self._foreign()
        fields = response.unpack(self._recv(response.size))
        self.answered = True
        return fields

    def _send(self, data: bytes) -> None:
        try:
            self.sock.settimeout(self._left())
            self.sock.sendall(data)
        except TimeoutError:
            raise self._silent() from None
        except (BrokenPipeError, ConnectionResetError):
            raise self._closed() from None
        except OSError as exc:
            raise self._lost(exc) from None

    def _recv(self, n: int) -> bytes:
        start = len(self.received)
        while len(self.received) - start < n:
            try:
                self.sock.settimeout(self._left())
                chunk = self.sock.recv(n - (len(self.received) - start))
            except TimeoutError:
                raise self._silent() from None
            except ConnectionResetError:
                chunk = b""
            except OSError as exc:
                raise self._lost(exc) from None
            if not chunk:
                raise self._closed()
            self.received += chunk
        return bytes(self.received[start:])

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._silent()
        return left

    def _read_a_little_more(self) -> None:
        """Up to _SHOWN_CHARS more bytes of a foreign answer, if they come at once: for the message."""
        with contextlib.suppress(OSError):
            self.sock.settimeout(min(max(self.deadline - time.monotonic(), 0.001), 0.2))
            self.received += self.sock.recv(_SHOWN_CHARS)

    def _silent(self) -> WorkerError:
        within = _seconds(self.timeout)
        if self.received:
            return self._foreign()
        if self.answered:
            return WorkerError(f"worker {self.endpoint} answered HELLO but then nothing within {within}")
        return WorkerError(
            f"worker {self.endpoint} accepted the connection but did not answer within {within} "
            "(a worker serves one client at a time: is another runner using it? Or is this no worker at all?)"
        )

    def _closed(self) -> WorkerError:
        if self.received:
            return self._foreign()
        if self.answered:
            return WorkerError(
                f"worker {self.endpoint} went away during the handshake (it closed the connection)"
            )
        return WorkerError(
            f"{self.endpoint} is not a ggml-rpc worker (it closed the connection; "
            "a worker from another llama.cpp version does that too)"
        )

    def _lost(self, exc: OSError) -> WorkerError:
        return WorkerError(f"lost the connection to worker {self.endpoint}: {exc.strerror or exc}")

    def _foreign(self) -> WorkerError:
        return WorkerError(f"{self.endpoint} is not a ggml-rpc worker (it answered {self._shown()})")

    def _shown(self) -> str:
        """What came back, as at most _SHOWN_CHARS printable characters, or as hex if it is binary."""
        data = bytes(self.received)
        text = " ".join("".join(chr(b) if 32 <= b < 127 else " " for b in data).split())
        if text and len(text) * 2 >= len(data[:64]):
            return f'"{text[:_SHOWN_CHARS]}…"' if len(text) > _SHOWN_CHARS else f'"{text}"'
        return f"bytes {data[:8].hex(' ')}" + (" …" if len(data) > 8 else "")
