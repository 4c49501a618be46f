"""What the fake Hub can be told to do wrong: faults, what they match, and the record of each request."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any, Literal

FaultKind = Literal["status", "drop", "corrupt", "stall", "disconnect", "trickle"]


@dataclass(frozen=True)
class RequestInfo:
    """What a fault predicate sees: the method, the decoded path, the query, the headers (any case)."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Message


@dataclass
class Fault:
    match: str | Callable[[RequestInfo], bool]
    kind: FaultKind
    times: int | None
    method: str | None
    params: dict[str, Any]
    hits: int = 0

    @property
    def body(self) -> bool:
        """Whether it acts on a response body (else it acts before anything is sent)."""
        return self.kind in ("drop", "corrupt", "trickle") or (
            self.kind == "stall" and self.params["after"] is not None
        )

    def applies(self, info: RequestInfo) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and self.method != info.method:
            return False
        return self.match in info.path if isinstance(self.match, str) else bool(self.match(info))


FAULT_DEFAULTS: dict[str, dict[str, Any]] = {
    "status": {"status": 503, "error_code": None, "message": None, "retry_after": None, "headers": None},
    "drop": {"drop_after": 0, "reset": False},
    "corrupt": {"offset": 0, "data": None, "length": 1},
    "stall": {"seconds": 1.0, "after": 0, "then": "continue"},
    "disconnect": {"reset": False},
    "trickle": {"rate": 1024, "for_bytes": None},
}


@dataclass
class RequestRecord:
    method: str
    path: str  # decoded, without the query
    query: str
    range: str | None
    authorization: bool
    port: int
    status: int | None = None
    bytes_sent: int = 0  # body bytes written to the socket
    fault: str | None = None  # kinds of the faults that fired, comma-separated


def damage(piece: bytes, position: int, damage_at: list[tuple[int, bytes | None, int]]) -> bytes:
    """`piece` (the body bytes from `position`) with each (offset, overwrite, flip length) applied."""
    buf = bytearray(piece)
    for offset, data, flip in damage_at:
        end = offset + (len(data) if data is not None else flip)
        for i in range(max(offset, position), min(end, position + len(buf))):
            buf[i - position] = data[i - offset] if data is not None else buf[i - position] ^ 0xFF
    return bytes(buf)
