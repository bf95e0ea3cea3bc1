"""peer_sockets.cut against the kernel: a process on the other end of a cut connection reads
end-of-file at once (what unblocks a sibling rank waiting on this one in a failed collective),
and a connection to an address that is not a peer keeps working."""
from __future__ import annotations

import socket
import subprocess
import sys

from constructs_lib.runtime import peer_sockets

# The other end: listens on two loopback addresses, says what each accepted connection reads.
SERVER = r"""
import select, socket, sys
ls = []
for addr in ("127.0.0.2", "127.0.0.3"):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 0)); s.listen()
    ls.append(s)
print(" ".join(str(s.getsockname()[1]) for s in ls), flush=True)
conns = {}
for s in ls:
    c, _ = s.accept(); conns[c] = s.getsockname()[0]
while conns:
    ready, _, _ = select.select(list(conns), [], [], 60)
    if not ready:
        break
    for c in ready:
        data = c.recv(1)
        print(("eof" if not data else "data") + " " + conns[c], flush=True)
        if not data:
            del conns[c]
        elif data == b"q":
            sys.exit(0)
"""


def test_a_cut_connection_reads_eof_on_the_other_end_and_others_keep_working(tmp_path):
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        peer_port, other_port = map(int, server.stdout.readline().split())
        peer = socket.create_connection(("127.0.0.2", peer_port), timeout=10)
        other = socket.create_connection(("127.0.0.3", other_port), timeout=10)
        assert peer_sockets.cut({"127.0.0.2"}) == 1
        assert server.stdout.readline().split() == ["eof", "127.0.0.2"]
        other.sendall(b"x")
        assert server.stdout.readline().split() == ["data", "127.0.0.3"]
        other.sendall(b"q")
        assert server.wait(timeout=30) == 0
        assert peer.recv(1) == b""  # this side is shut down too; its descriptor is still the owner's
        peer.close()
        other.close()
    finally:
        server.kill()
        server.wait()


def test_members_are_the_hostfiles_addresses(tmp_path):
    f = tmp_path / "hostfile"
    f.write_text("10.0.0.5 slots=8\n10.0.0.7 slots=8\n\n")
    assert peer_sockets.members(str(f)) == {"10.0.0.5", "10.0.0.7"}
    assert peer_sockets.members(str(tmp_path / "none")) == set()
