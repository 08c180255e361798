"""What the processes of a running world listen on: the TCP sockets in LISTEN state of a
process and all its descendants, read from /proc (Linux)."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

LISTEN = "0A"


def descendants(root: int) -> set[int]:
    """``root`` and every process below it, by parent pid."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        address = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four 32-bit words, each little-endian
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        address = socket.inet_ntop(socket.AF_INET6, words)
    return f"{address}:{int(port, 16)}"


def listening(root: int) -> dict[str, int]:
    """Every TCP address a process of ``root``'s tree listens on, with the pid that owns it."""
    owners = {inode: pid for pid in descendants(root) for inode in _socket_inodes(pid)}
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN and int(fields[9]) in owners:
                found[_address(fields[1])] = owners[int(fields[9])]
    return found


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    ip = ipaddress.ip_address(host)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
