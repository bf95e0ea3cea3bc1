"""peer_sockets.cut against the kernel: a process on the other end of a cut connection reads
end-of-file at once (what unblocks a sibling rank waiting on this one in a failed collective),
and a connection to an address that is not a peer keeps working."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


# This side runs in its own process: cut() acts on every connection of the process that calls it,
# and a pytest worker holds other tests' connections (an in-process moto server and its clients).
CLIENT = r"""
import socket, sys
from constructs_lib.runtime import peer_sockets
peer = socket.create_connection(("127.0.0.2", int(sys.argv[1])), timeout=10)
other = socket.create_connection(("127.0.0.3", int(sys.argv[2])), timeout=10)
print(peer_sockets.cut({"127.0.0.2"}), flush=True)
sys.stdin.readline()
other.sendall(b"x")
sys.stdin.readline()
other.sendall(b"q")
print("peer-eof" if peer.recv(1) == b"" else "peer-open", flush=True)
"""


def test_a_cut_connection_reads_eof_on_the_other_end_and_others_keep_working():
    root = Path(__file__).resolve().parents[2]
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    client = None
    try:
        ports = server.stdout.readline().split()
        client = subprocess.Popen([sys.executable, "-c", CLIENT, *ports], cwd=root, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert client.stdout.readline().split() == ["1"]
        assert server.stdout.readline().split() == ["eof", "127.0.0.2"]
        client.stdin.write("\n")
        client.stdin.flush()
        assert server.stdout.readline().split() == ["data", "127.0.0.3"]
        client.stdin.write("\n")
        client.stdin.flush()
        assert server.wait(timeout=30) == 0
        # this side is shut down too; its descriptor is still the owner's
        assert client.stdout.readline().split() == ["peer-eof"]
        assert client.wait(timeout=30) == 0
    finally:
        for p in (server, client):
            if p is not None:
                p.kill()
                p.wait()


def test_members_are_the_hostfiles_addresses(tmp_path):
    f = tmp_path / "hostfile"
    f.write_text("10.0.0.5 slots=8\n10.0.0.7 slots=8\n\n")
    assert peer_sockets.members(str(f)) == {"10.0.0.5", "10.0.0.7"}
    assert peer_sockets.members(str(tmp_path / "none")) == set()
