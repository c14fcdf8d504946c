"""A network namespace a test makes and removes: servers bound to ``0.0.0.0`` inside it listen on
nothing outside it. A veth pair joins it to this namespace (``host`` here, ``address`` there, a
/30 of 10.0.0.0/8 no interface here uses), so the test reaches the servers directly.

:func:`namespace` skips with the reason when namespaces cannot be made (not root, no
CAP_SYS_ADMIN, no ``ip``); :func:`listening` reads a namespace's listening TCP sockets from
``/proc/PID/net`` and :func:`socket_inodes` a process's sockets, so a test can show where a
process listens.
"""

from __future__ import annotations

import os
import queue
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

__all__ = ["Namespace", "namespace", "listening", "socket_inodes", "Started", "start_in"]


@dataclass
class Namespace:
    name: str
    host: str  # this side of the veth pair
    address: str  # the namespace's side: what its servers are dialled at
    procs: list[subprocess.Popen[str]] = field(default_factory=list)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _free_subnet() -> tuple[str, str]:
    used = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
    for _ in range(100):
        prefix, d = f"10.{random.randrange(100, 250)}.{random.randrange(256)}.", random.randrange(64) * 4
        if prefix not in used:
            return f"{prefix}{d + 1}", f"{prefix}{d + 2}"
    pytest.skip("no free 10.x.y.z/30 for the test's veth pair")


@contextmanager
def namespace() -> Iterator[Namespace]:
    """A fresh namespace with ``lo`` up and a veth pair to this one; removed (with its processes
    killed) afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("network namespace tests need iproute2's `ip`")
    tag = f"{os.getpid() % 100000}{random.randrange(1000):03d}"
    name, here, there = f"fftest{tag}", f"ffh{tag}", f"ffn{tag}"
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        why = made.stderr.strip()
        pytest.skip(f"cannot create a network namespace (`ip netns add` needs root or CAP_SYS_ADMIN): {why}")
    ns = Namespace(name, "", "")
    try:
        ns.host, ns.address = _free_subnet()
        for step in (
            ("link", "add", here, "type", "veth", "peer", "name", there, "netns", name),
            ("addr", "add", f"{ns.host}/30", "dev", here),
            ("link", "set", here, "up"),
            ("-n", name, "addr", "add", f"{ns.address}/30", "dev", there),
            ("-n", name, "link", "set", there, "up"),
            ("-n", name, "link", "set", "lo", "up"),
        ):
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot set up the test's veth pair (`ip {' '.join(step)}`): {done.stderr.strip()}")
        yield ns
    finally:
        for p in ns.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
        _ip("link", "del", here)  # absent when the pair was not made; gone with the namespace anyway
        removed = _ip("netns", "del", name)
        assert removed.returncode == 0, f"could not remove the test's namespace {name}: {removed.stderr}"


@dataclass
class Started:
    proc: subprocess.Popen[str]
    lines: dict[str, str]  # prefix -> the rest of the first line starting with it


def start_in(ns: Namespace, args: list[str], wait_for: tuple[str, ...], deadline_s: float = 60.0) -> Started:
    """Run ``python -m flightfeed.server ARGS`` inside ``ns``; return once it printed a line for every
    prefix in ``wait_for`` (a deadline, not a timing claim: a node that hangs at start-up fails the
    test with its stderr instead of hanging it)."""
    cmd = ["ip", "netns", "exec", ns.name, sys.executable, "-m", "flightfeed.server", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ns.procs.append(proc)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    found: dict[str, str] = {}
    end = time.monotonic() + deadline_s
    while set(found) != set(wait_for):
        try:
            line = lines.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"`{' '.join(args)}` never printed {wait_for} (found {found}); stderr:\n{err}")
        for prefix in wait_for:
            if line.startswith(prefix) and prefix not in found:
                found[prefix] = line[len(prefix):].strip()
    return Started(proc, found)


def listening(pid: int | str) -> dict[int, tuple[str, int]]:
    """{socket inode: (address, port)} of the TCP sockets listening in ``pid``'s namespace."""
    out: dict[int, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A":  # LISTEN
                continue
            addr, port = cols[1].rsplit(":", 1)
            out[int(cols[9])] = (_address(addr), int(port, 16))
    return out


def _address(hex_addr: str) -> str:
    if len(hex_addr) == 8:
        return ".".join(str(int(hex_addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return "::" if set(hex_addr) == {"0"} else hex_addr.lower()


def socket_inodes(pid: int) -> set[int]:
    """The inodes of every socket process ``pid`` holds open."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out
