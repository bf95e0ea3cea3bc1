"""Cut a failed generation's connections to its peers, so that no sibling rank stays blocked on them.

When a peer dies, the survivor whose collective failed first leaves it; a sibling rank in the same
collective may be waiting on data from this one, not from the dead peer, and gloo waits out its
timeout (30 minutes by default) on a socket that is still open. Destroying the process group
should close those sockets, but the group can stay referenced from C++ (measured: once
torch.distributed._functional_collectives is imported, a destroyed gloo group keeps 12 references
no Python referrer explains), so its sockets stay open. shutdown(2) on this process's own side of
each peer connection ends the sibling's wait at once (it reads end-of-file: its collective fails,
and it parks too). The descriptors are left to their owner: shutdown ends the connection, not the
descriptor, so a group freed later closes its own.

Which connections: TCP, established, whose remote address is one of the generation's members (the
hostfile the supervisor wrote for it) or an address a gloo listener of this process is bound to
(GLOO_SOCKET_IFNAME may put every peer on one interface's address). Connections to anywhere else
(object storage, a metrics service) are left alone.
"""
from __future__ import annotations

import os
import socket
from typing import Iterable, Optional

_ESTABLISHED, _LISTEN = "01", "0A"
_ANY = {"0.0.0.0", "::"}


def _ip(hex_addr: str) -> str:
    """A /proc/net/tcp{,6} address's IP in text form (IPv4-mapped IPv6 as the IPv4 address)."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # each 32-bit word is host order
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def _rows(pid: str = "self") -> Iterable[tuple[str, str, str, str]]:
    """(state, local ip, remote ip, inode) of every TCP socket in this process's network namespace."""
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) < 10:
                        continue
                    yield fields[3], _ip(fields[1].split(":")[0]), _ip(fields[2].split(":")[0]), fields[9]
        except (OSError, ValueError):
            continue


def _own_sockets() -> dict[str, int]:
    """socket inode -> one of this process's descriptors for it."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.setdefault(target[8:-1], int(fd))
    return found


def addresses(hostfile: Optional[str]) -> list[str]:
    """The addresses in an MPI-style hostfile ("ADDR slots=N" per line, rendezvous.py writes it in
    node-rank order), in order; empty if it cannot be read."""
    try:
        with open(hostfile or "") as f:
            return [line.split()[0] for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return []


def members(hostfile: Optional[str]) -> set[str]:
    return set(addresses(hostfile))


def cut(peers: set[str]) -> int:
    """shutdown(2) this process's established TCP connections to `peers` and to the addresses its own
    listeners are bound to; how many were cut."""
    own = _own_sockets()
    rows = [r for r in _rows() if r[3] in own]
    listening = {local for state, local, _remote, _inode in rows if state == _LISTEN} - _ANY
    targets = (peers | listening) - _ANY
    done = 0
    for state, _local, remote, inode in rows:
        if state != _ESTABLISHED or remote not in targets:
            continue
        try:
            s = socket.socket(fileno=os.dup(own[inode]))
        except OSError:
            continue
        try:
            s.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass
        finally:
            s.close()  # the duplicate only; the owner's descriptor stays its own
    return done
