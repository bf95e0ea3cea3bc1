"""The memory tier's buddy connection (memory_link.py) as hostile ground: only the expected buddy,
from its own address and with the token it was given, gets in; a frame is bounded before a byte
of its payload is read. Loopback addresses only (127.0.0.x), every socket closed."""
from __future__ import annotations

import json
import socket
import struct
import threading

import pytest

from constructs_lib.runtime import memory_link
from constructs_lib.runtime.memory_link import Link, LinkError


def _hello(src: str, port: int, frm: int, token: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(src, 0))
    Link._send(s, {"hello": frm, "token": token}, ())
    return s


def test_only_the_buddy_from_its_own_address_with_its_token_is_accepted(monkeypatch):
    monkeypatch.setattr(memory_link, "CONNECT_TIMEOUT", 10.0)
    link = object.__new__(Link)
    link.frm = 3
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    got: list = []
    t = threading.Thread(target=lambda: got.append(link._accept(listener, "127.0.0.2", "sekret")))
    t.start()
    intruders = [_hello("127.0.0.2", port, 3, "guess"),      # the buddy's address and rank, not its token
                 _hello("127.0.0.1", port, 3, "guess"),      # a member that does not know the token
                 _hello("127.0.0.3", port, 3, "sekret"),     # the token, from another address
                 _hello("127.0.0.2", port, 2, "sekret")]     # the buddy's address, as another rank
    raw = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0))
    raw.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(64))       # not a frame at all
    buddy = _hello("127.0.0.2", port, 3, "sekret")
    t.join(timeout=20)
    try:
        assert got and got[0].getpeername()[0] == "127.0.0.2"
        for s in intruders + [raw]:
            s.settimeout(5)
            try:
                assert s.recv(1) == b"", "each intruder's connection was closed"
            except ConnectionResetError:
                pass  # closed with bytes it sent unread
    finally:
        for s in intruders + [raw, buddy, *got, listener]:
            s.close()


def test_no_buddy_in_time_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(memory_link, "CONNECT_TIMEOUT", 0.5)
    link = object.__new__(Link)
    link.frm = 1
    with socket.create_server(("127.0.0.1", 0)) as listener, pytest.raises(LinkError, match="did not connect"):
        link._accept(listener, "127.0.0.2", "t")


def _frame(header: bytes, plen: int, magic: bytes = b"DLMT") -> bytes:
    return struct.pack("<4sIQ", magic, len(header), plen) + header


@pytest.mark.parametrize("data, room, why", [
    (_frame(b"{}", 1 << 40), 1 << 30, "more than the memory directory can hold"),
    (_frame(b"{}", 0, magic=b"HTTP"), 1 << 30, "not a memory tier frame"),
    (struct.pack("<4sIQ", b"DLMT", memory_link.MAX_HEADER + 1, 0), 1 << 30, "not a memory tier frame"),
    (_frame(b"[1, 2]", 0), 1 << 30, "not an object"),
    (_frame(json.dumps({"kind": "raw"}).encode(), 10) + b"short", 1 << 30, "closed"),
])
def test_a_frame_is_bounded_before_its_payload_is_read(data, room, why):
    a, b = socket.socketpair()
    try:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        b.settimeout(5)
        with pytest.raises(LinkError, match=why):
            memory_link._read_frame(b, lambda header, plen: plen <= room)
    finally:
        a.close()
        b.close()


def test_a_frame_of_many_buffers_arrives_whole_and_the_reader_reuses_its_buffer():
    a, b = socket.socketpair()
    try:
        bufs = [bytes([i]) * (1000 * i + 1) for i in range(40)]
        sender = threading.Thread(target=lambda: [Link._send(a, {"n": k}, bufs[k:]) for k in (0, 30)])
        sender.start()
        buf = bytearray()
        for k in (0, 30):
            header, payload = memory_link._read_frame(b, lambda header, plen: True, buf=buf)
            assert header == {"n": k} and bytes(payload) == b"".join(bufs[k:])
            payload = None
        sender.join(timeout=10)
    finally:
        a.close()
        b.close()


def test_this_nodes_address_is_its_hostfile_line_else_the_route_to_the_master(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("10.0.0.5 slots=8\n10.0.0.9 slots=8\n")
    assert memory_link.node_address(1, str(hostfile), "10.0.0.5") == "10.0.0.9"
    assert memory_link.node_address(0, str(tmp_path / "none"), "127.0.0.1") == "127.0.0.1"


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname(), timeout=5)
        b, _ = listener.accept()
    return a, b


def _sender(sock: socket.socket, timeout: float) -> Link:
    """A Link's sending half on `sock`, as Link.__init__ leaves it (its timeout: non-blocking underneath)."""
    import select

    link = object.__new__(Link)
    link.out, link.to, link.timeout = sock, 1, timeout
    sock.settimeout(timeout)
    link._writable = select.poll()
    link._writable.register(sock, select.POLLOUT)
    return link


def test_a_slot_sent_by_sendfile_arrives_whole_in_the_buddys_slot_and_a_stalled_buddy_is_an_error(tmp_path):
    """A slot's bytes go by sendfile and are read straight into the held slot's mapping (no buffer
    on either side); 24 MB is many times a loopback socket's buffer, so the sender waits on a full
    socket again and again. A buddy that stops reading fails the send within its timeout."""
    from constructs_lib.runtime import memory_slots

    data = bytes(range(256)) * (24 << 12)  # 24 MiB
    own = memory_slots.Slots(str(tmp_path / "own"), 2)
    own.write(7, "a7", 3, [data[:5], data[5:]])
    held = memory_slots.Slots(str(tmp_path / "held"), 2)
    a, b = _tcp_pair()
    try:
        sender = threading.Thread(target=lambda: _sender(a, 10.0).send_file({"step": 7}, *own.raw_of(7)))
        sender.start()
        b.settimeout(10)
        header, payload = memory_link._read_frame(b, lambda h, n: True,
                                                  into=lambda h, n: held.receive_into(h["step"], n))
        held.received(7, "a7", 3, payload.nbytes)
        payload = None
        sender.join(timeout=20)
        assert header == {"step": 7}
        assert memory_slots.stamped_steps(str(tmp_path / "held")) == {7}
        assert (tmp_path / "held" / "slots" / "__2.s0.raw").read_bytes() == data

        stalled = _sender(a, 0.5)  # b reads nothing more
        with pytest.raises(LinkError, match="took nothing"):
            for _ in range(20):
                stalled.send_file({"step": 8}, *own.raw_of(7))
    finally:
        own.close()
        held.close()
        a.close()
        b.close()


def test_a_frame_cut_short_leaves_its_slot_unstamped_and_the_step_before_whole(tmp_path):
    """The buddy dies while step 5's bytes arrive: the slot they went into holds no step, and step
    4's slot, the one the survivors fall back to, is untouched."""
    from constructs_lib.runtime import memory_slots

    held = memory_slots.Slots(str(tmp_path), 3)
    held.write(4, "a4", 2, [b"4" * 3000])
    a, b = _tcp_pair()
    try:
        a.sendall(_frame(b"{}", 3000) + b"5" * 1000)
        a.close()
        b.settimeout(5)
        with pytest.raises(LinkError, match="closed"):
            memory_link._read_frame(b, lambda h, n: True, into=lambda h, n: held.receive_into(5, n))
        assert memory_slots.stamped_steps(str(tmp_path)) == {4}
        assert (tmp_path / "slots" / "__3.s0.raw").read_bytes() == b"4" * 3000
        with pytest.raises(ValueError, match="not being received"):
            held.received(6, "a6", 2, 3000)
    finally:
        held.close()
        b.close()
