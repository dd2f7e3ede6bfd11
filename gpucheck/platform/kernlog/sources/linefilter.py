"""The fast line filter: only lines holding ``NVRM`` (every GPU driver line), ``SXid`` (every
NVSwitch error line) or a needle of another kernel-log parser (PCIe AER: platform/kernlog/aer.py;
the network events, link and carrier changes and the GPUDirect RDMA module:
platform/kernlog/netevents.py) are kept, found with bytes.find over big buffers before any
decoding."""

from __future__ import annotations

from typing import IO, Any, Iterator

from ..aer import AER_NEEDLES
from ..netevents import NET_NEEDLES

# A relevant line holds one of these (bytes test before any decoding or regex): every GPU
# driver line says NVRM, every NVSwitch error line SXid; each other parser's list is kept in the
# module that owns it (PCIe AER lines: kernlog.aer.AER_NEEDLES; the network checks' lines,
# net.flaps and gdr.peermem: kernlog.netevents.NET_NEEDLES).
XID_NEEDLES: tuple[bytes, ...] = (b"NVRM", b"SXid")
NEEDLES: tuple[bytes, ...] = XID_NEEDLES + AER_NEEDLES + NET_NEEDLES
# In big buffers a needle is found through its rarest byte (bytes.find of one byte is memchr),
# each hit then checked in place. The rarest byte is picked per buffer from a sample of it.
ANCHOR_SAMPLE = 1 << 16
CHUNK_BYTES = 16 << 20
MAX_LINE_BYTES = 64 << 10  # longer lines are cut here (and their rest skipped)


class Counter:
    def __init__(self) -> None:
        self.bytes = 0


def has_needle(b: bytes | bytearray, needles: tuple[bytes, ...]) -> bool:
    return any(nd in b for nd in needles)


def matching_lines(data: Any, start: int, end: int, needles: tuple[bytes, ...],
                    max_line: int) -> list[bytes]:
    """Complete lines in data[start:end] (end is the position of a newline) holding a needle.

    A needle is searched for through its anchor byte (bytes.find of one byte is memchr), and each
    hit is checked in place; a line is taken once, then the search goes on after it.
    """
    spans: dict[int, int] = {}
    find, rfind = data.find, data.rfind
    sample = data[start:start + ANCHOR_SAMPLE]
    for nd in needles:
        k = min(range(len(nd)), key=lambda i: sample.count(nd[i:i + 1]))
        a = nd[k:k + 1]
        j = k - 1 if k > 0 else min(1, len(nd) - 1)  # a neighbour byte: a cheap first check
        b = nd[j]
        m = len(nd)
        p = find(a, start + k, end)
        while p >= 0:
            if data[p - k + j] != b or data[p - k:p - k + m] != nd:
                p = find(a, p + 1, end)
                continue
            ls = rfind(b"\n", start, p) + 1
            if ls == 0:
                ls = start
            le = find(b"\n", p, end)
            if le < 0:
                le = end
            spans[ls] = le
            p = find(a, le + 1 + k, end) if le < end else -1
    if not spans:
        return []
    out = []
    for ls in sorted(spans):
        le = spans[ls]
        out.append(bytes(data[ls:min(le, ls + max_line)]))
    return out


def iter_relevant_lines(f: IO[bytes], *, needles: tuple[bytes, ...] = NEEDLES,
                        chunk_bytes: int = CHUNK_BYTES, max_line: int = MAX_LINE_BYTES,
                        counter: Counter | None = None) -> Iterator[bytes]:
    """Lines of a binary stream (without the newline) that hold one of `needles`, in order.

    Reads big chunks and searches them with bytes.find, so the cost is close to one pass over
    the data. Garbage and binary data pass through harmlessly; a line longer than `max_line` is
    cut there and the rest of it skipped (a huge line costs nothing more).
    """
    carry = b""
    skipping = False  # inside the rest of an overlong line
    readinto = getattr(f, "readinto", None)
    # The buffer starts small and grows to chunk_bytes while reads keep filling it.
    buf = bytearray(min(chunk_bytes, 1 << 16)) if readinto is not None else None
    while True:
        if buf is not None:
            n = readinto(buf)  # type: ignore[misc]
            if not n:
                break
            data: bytes | bytearray = buf if n == len(buf) else buf[:n]
            if n == len(buf) and len(buf) < chunk_bytes:
                buf = bytearray(min(chunk_bytes, len(buf) * 8))
        else:
            data = f.read(chunk_bytes)
            if not data:
                break
        if counter is not None:
            counter.bytes += len(data)
        first_nl = data.find(b"\n")
        if first_nl < 0:
            if skipping:
                continue
            carry += bytes(data)
            if len(carry) > max_line:
                head = carry[:max_line]
                if has_needle(head, needles):
                    yield head
                carry, skipping = b"", True
            continue
        if skipping:
            skipping = False
        else:
            line = carry + data[:first_nl] if carry else bytes(data[:first_nl])
            if len(line) > max_line:
                line = line[:max_line]
            if has_needle(line, needles):
                yield line
        carry = b""
        last_nl = data.rfind(b"\n")
        if last_nl > first_nl:
            yield from matching_lines(data, first_nl + 1, last_nl, needles, max_line)
        tail = bytes(data[last_nl + 1:])
        if len(tail) > max_line:
            head = tail[:max_line]
            if has_needle(head, needles):
                yield head
            skipping = True
        else:
            carry = tail
    if carry and not skipping and has_needle(carry, needles):
        yield carry


def decode_line(b: bytes) -> str:
    return b.decode("utf-8", "replace").rstrip("\r")
