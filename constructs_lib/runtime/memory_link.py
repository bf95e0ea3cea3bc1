"""The memory tier's connections to its buddies (issue 37): one TCP connection from each rank to
the same local rank of the node it sends to, and one from the node it receives from.

A snapshot's bytes go over it as one frame, sent with one sendmsg of the state's own buffers and
read by a thread of its own (both sides send before they read: a reader that is always there
keeps two large sends from waiting on each other). gloo's point-to-point calls did the same for
more CPU than the bytes of a small model cost (measured: 1.4 ms a snapshot on the tier's thread,
and more on gloo's), and they need the whole group; the tier keeps its group for the one
collective a snapshot still takes.

Who can write here: anyone who can reach the port (the cluster's security group lets members in).
A connection counts only if it comes from the expected buddy's address and its first frame
carries the token that buddy was given through the tier's own process group; every frame after
that is bounded (its header by MAX_HEADER, its payload by what the memory directory can hold)
and its contents are checked by whoever takes them.

    frame: b"DLMT" | u32 header length | u64 payload length | header (JSON) | payload
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import select
import socket
import struct
import threading
import time
from typing import Any, Callable, Optional, Sequence

from . import memory_raw, peer_sockets

MAGIC = b"DLMT"
_HEAD = struct.Struct("<4sIQ")
MAX_HEADER = 64 << 20
CONNECT_TIMEOUT = 60.0
HELLO_TIMEOUT = 5.0


class LinkError(RuntimeError):
    pass


def node_address(node_rank: int, hostfile: Optional[str], master: str) -> str:
    """This node's address: its line of the generation's hostfile (the plan's order is the node
    ranks'), else the address this host reaches the master from (a job outside a node)."""
    lines = peer_sockets.addresses(hostfile)
    if 0 <= node_rank < len(lines):
        return lines[node_rank]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, 9))  # no packet: the kernel only picks the route's source address
        return s.getsockname()[0]


class Link:
    """Made on every rank at once (collective over `group`): each rank listens, the ranks trade
    (address, port, token), each connects to `to` and accepts `frm`. `addr` may be the error that
    kept this rank from finding its address: the others learn of it through the same gather."""

    def __init__(self, group: Any, *, rank: int, to: int, frm: int, addr: "str | OSError",
                 fits: Callable[[dict, int], bool], timeout: float) -> None:
        import torch.distributed as dist

        self.rank, self.to, self.frm, self.timeout, self.fits = rank, to, frm, timeout, fits
        token = secrets.token_hex(16)
        listener: Optional[socket.socket] = None
        try:
            if isinstance(addr, OSError):
                raise addr
            listener = socket.create_server((addr, 0), backlog=16)
            mine: Any = (addr, listener.getsockname()[1], token)
        except OSError as e:  # every rank still takes part in the gather, and every rank learns of it
            mine = f"{addr if isinstance(addr, str) else 'its address'}: {e}"
        info: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(info, mine, group=group)
        bad = [(r, i) for r, i in enumerate(info) if not isinstance(i, tuple)]
        if bad or listener is None:
            if listener is not None:
                listener.close()
            raise LinkError(f"rank {bad[0][0]} could not listen on {bad[0][1]}")
        try:
            # from this node's own address: the buddy checks where a connection comes from
            self.out = socket.create_connection(tuple(info[to][:2]), timeout=CONNECT_TIMEOUT, source_address=(addr, 0))
            self.out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._send(self.out, {"hello": rank, "token": info[to][2]}, ())
            self.inb = self._accept(listener, info[frm][0], token)
        except BaseException:
            if hasattr(self, "out"):
                self.out.close()
            raise
        finally:
            listener.close()
        self.out.settimeout(timeout)
        self.frames: "queue.SimpleQueue[tuple[Optional[dict], Any]]" = queue.SimpleQueue()
        self.handler: Callable[[dict, memoryview], Any] = lambda header, payload: None
        self.into: Optional[Callable[[dict, int], Optional[memoryview]]] = None
        self._writable = select.poll()
        self._writable.register(self.out, select.POLLOUT)
        self.closed = False
        self.reader = threading.Thread(target=self._read, daemon=True, name="dl-memory-link")

    def _accept(self, listener: socket.socket, addr: str, token: str) -> socket.socket:
        """The expected buddy's connection; anything else that connects first is closed."""
        until = time.monotonic() + CONNECT_TIMEOUT
        while True:
            left = until - time.monotonic()
            if left <= 0:
                raise LinkError(f"rank {self.frm} did not connect within {CONNECT_TIMEOUT:.0f} s")
            listener.settimeout(left)
            try:
                conn, peer = listener.accept()
            except socket.timeout:
                continue
            # a connection that says nothing holds the door only this long
            conn.settimeout(min(HELLO_TIMEOUT, max(0.1, until - time.monotonic())))
            try:
                hello, _ = _read_frame(conn, lambda header, plen: False, max_header=4096)
            except (OSError, LinkError, ValueError):
                conn.close()
                continue
            if peer[0] == addr and hello.get("hello") == self.frm and hello.get("token") == token:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(None)  # the reader waits as long as training goes on
                return conn
            conn.close()

    def start(self, handler: Callable[[dict, memoryview], Any],
              into: Optional[Callable[[dict, int], Optional[memoryview]]] = None) -> None:
        """Read frames on a thread of their own: handler(header, payload) for each; what it returns
        (or the error it raised) is what take() gives next. into(header, size), when given, may
        name where a frame's payload is read to (a slot's mapping), else it goes to a buffer."""
        self.handler, self.into = handler, into
        self.reader.start()

    def _read(self) -> None:
        buf = bytearray()  # reused: the handler is done with a frame's payload before the next is read
        while not self.closed:
            try:
                header, payload = _read_frame(self.inb, self.fits, buf=buf, into=self.into)
                got = self.handler(header, payload)
                payload = None  # no view of buf left: the next frame may grow it
                self.frames.put((header, got))
            except BaseException as e:  # noqa: BLE001 - a lost buddy or a bad frame: take() raises it
                self.frames.put((None, e))
                return

    def send(self, header: dict, buffers: Sequence[Any] = ()) -> None:
        self._send(self.out, header, buffers)

    def send_file(self, header: dict, fd: int, size: int) -> None:
        """A frame whose payload is the first `size` bytes of open file `fd` (a raw slot), sent by
        sendfile: the kernel sends the file's pages as they are, with no copy into the socket's
        buffers first (one copy of a snapshot's bytes fewer than send's). The pages are read as the
        connection drains, so the file must not change until the buddy has the frame: a slot is
        written again two snapshots later, after a vote every rank passes only once it has its
        buddy's frame whole."""
        out = _head(header, size)
        while out:  # held back (MSG_MORE) to go out with the payload's first bytes
            memory_raw.written(out, self.out.sendmsg(out, [], socket.MSG_MORE if size else 0))
        at = 0
        while at < size:
            try:
                n = os.sendfile(self.out.fileno(), fd, at, min(size - at, 1 << 30))
            except BlockingIOError:  # the socket's timeout makes it non-blocking underneath
                n = None
            if n is None:
                if not self._writable.poll(self.timeout * 1000):  # poll: a process may have fds past select's 1024
                    raise LinkError(f"rank {self.to} took nothing for {self.timeout:.0f} s")
                continue
            if n == 0:
                raise LinkError(f"{size - at} bytes of the slot short of its size")
            at += n

    def take(self) -> tuple[dict, Any]:
        """The next frame's header and what the handler made of it; raises on a lost buddy."""
        try:
            header, got = self.frames.get(timeout=self.timeout)
        except queue.Empty:
            raise LinkError(f"nothing from rank {self.frm} in {self.timeout:.0f} s") from None
        if header is None:
            raise LinkError(f"the connection from rank {self.frm}: {type(got).__name__}: {got}")
        return header, got

    @staticmethod
    def _send(sock: socket.socket, header: dict, buffers: Sequence[Any]) -> None:
        views = [memoryview(b).cast("B") for b in buffers]
        out = _head(header, sum(v.nbytes for v in views)) + views
        while out:
            memory_raw.written(out, sock.sendmsg(out[:512]))

    def close(self) -> None:
        """Both connections end: the reader and a buddy blocked on this rank get end-of-file."""
        self.closed = True
        for s in (self.out, self.inb):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _head(header: dict, plen: int) -> list[memoryview]:
    """A frame's fixed part and header, for a payload of `plen` bytes."""
    head = json.dumps(header).encode()
    return [memoryview(_HEAD.pack(MAGIC, len(head), plen)), memoryview(head)]


def _read_frame(sock: socket.socket, fits: Callable[[dict, int], bool], max_header: int = MAX_HEADER,
                buf: Optional[bytearray] = None,
                into: Optional[Callable[[dict, int], Optional[memoryview]]] = None) -> tuple[dict, memoryview]:
    magic, hlen, plen = _HEAD.unpack(_recv(sock, _HEAD.size))
    if magic != MAGIC or hlen > max_header:
        raise LinkError("not a memory tier frame")
    header = json.loads(bytes(_recv(sock, hlen)))
    if not isinstance(header, dict):
        raise LinkError("a frame whose header is not an object")
    if plen and not fits(header, plen):
        raise LinkError(f"a frame of {plen} bytes: more than the memory directory can hold")
    dest = into(header, plen) if into is not None else None
    if dest is not None:
        if dest.nbytes != plen:
            raise LinkError(f"a frame of {plen} bytes into {dest.nbytes}")
        return header, _fill(sock, dest)
    return header, _recv(sock, plen, buf)


def _recv(sock: socket.socket, n: int, buf: Optional[bytearray] = None) -> memoryview:
    if buf is None:
        buf = bytearray(n)
    elif len(buf) < n:
        buf.extend(bytes(n - len(buf)))
    return _fill(sock, memoryview(buf)[:n])


def _fill(sock: socket.socket, view: memoryview) -> memoryview:
    n = view.nbytes
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 24))
        if not k:
            raise LinkError("the buddy's connection closed")
        got += k
    return view
