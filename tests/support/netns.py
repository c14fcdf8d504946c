"""Network namespaces for tests and benchmarks, made here and removed afterwards.

**One namespace** (:func:`namespace`): servers bound to ``0.0.0.0`` inside it listen on nothing
outside it -- how a server bound to every address is tested without listening outside this
machine. A veth pair joins it to this namespace (``host`` here, ``address`` there, a /30 of
10.0.0.0/8 no interface here uses), so the test reaches the servers directly.

:func:`namespace` skips with the reason when namespaces cannot be made (not root, no
CAP_SYS_ADMIN, no ``ip``); :func:`listening` reads a namespace's listening TCP sockets from
``/proc/PID/net`` and :func:`socket_inodes` a process's sockets, so a test can show where a
process listens.

**Real links** (:class:`Links`): data nodes in namespaces behind capped links.

:class:`Links` makes one Linux bridge in the root namespace (the client's side, address
``10.231.N.1``) and, per node, a network namespace joined to the bridge by a veth pair, with an
address ``10.231.N.k`` from a /24 that it picked unused and owns. ``tc qdisc ... tbf rate R``
on the node's end of the pair caps what the node sends (this kernel has ``tbf``, not ``netem``).
Processes start inside a node with ``ip netns exec`` (:meth:`Links.popen`, :meth:`Links.serve`).
Traffic goes only to addresses this helper created.

Everything is removed on exit (also on failure): processes, namespaces (which takes their veth
ends with them) and the bridge. Names carry the owner's pid (``ffl<pid in hex><letter>...``), so
:func:`cleanup_leftovers` removes what a killed run left behind without touching a live run's.

    with Links() as links:
        fast, slow = links.add_node(rate_mbit=200), links.add_node(rate_mbit=50)
        node = links.serve(fast, {"img": "/data/img"}, "--peers", ...)
        ... FlightDataset(node.location, "img") ...

:func:`unavailable` says why namespaces cannot be made here (not root, no ``ip``/``tc``, the
kernel refuses), so tests can skip with that reason.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "Links",
    "Node",
    "Served",
    "unavailable",
    "cleanup_leftovers",
    "PREFIX",
    "Namespace",
    "namespace",
    "listening",
    "socket_inodes",
    "Started",
    "start_in",
]

PREFIX = "ffl"  # every name this helper makes starts with it (then the owner's pid)
_SUBNET = "10.231"  # 10.231.N.0/24, N picked unused per Links
_ROOT = Path(__file__).resolve().parents[2]
_OWNED = re.compile(rf"^{PREFIX}([0-9a-f]+)[g-z]")  # ffl<owner pid in hex><instance letter>
_INSTANCES = iter("ghijklmnopqrstuvwxyz")


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (None: they can)."""
    if sys.platform != "linux":
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (run the test as root, as CI does)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid():x}probe"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers() -> list[str]:
    """Remove namespaces and links of this helper whose owner process is gone; returns their names."""
    removed = []
    netns = _run("ip", "netns", "list", check=False).stdout.split("\n")
    for line in netns:
        name = line.split(" ", 1)[0].strip()
        owner = _OWNED.match(name)
        if owner and not _alive(int(owner.group(1), 16)):
            for pid in _run("ip", "netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    for dev in os.listdir("/sys/class/net") if os.path.isdir("/sys/class/net") else []:
        owner = _OWNED.match(dev)
        if owner and not _alive(int(owner.group(1), 16)):
            _run("ip", "link", "del", dev, check=False)
            removed.append(dev)
    return removed


def _free_subnet(start: int) -> int:
    """An N in 1..254 whose 10.231.N.0/24 no interface or route of this machine uses."""
    used_text = _run("ip", "-4", "addr", check=False).stdout + _run("ip", "-4", "route", check=False).stdout
    used = {int(m) for m in re.findall(rf"{re.escape(_SUBNET)}\.(\d+)\.", used_text)}
    for i in range(254):
        n = (start + i) % 254 + 1
        if n not in used:
            return n
    raise RuntimeError(f"no free {_SUBNET}.N.0/24 subnet left")


@dataclass
class Node:
    """One network namespace behind its own (optionally capped) link."""

    index: int
    netns: str
    address: str
    dev: str  # the node's end of the veth pair (inside the namespace)
    host_dev: str  # the bridge's end
    rate_mbit: float | None = None


@dataclass
class Served:
    """A ``flightfeed serve`` process running inside a node."""

    node: Node
    proc: subprocess.Popen[str]
    location: str
    log: IO[str]
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        self.log.seek(0)
        return "".join(self.lines) + self.log.read()


class Links:
    """A bridge in the root namespace and nodes in their own namespaces (see the module doc)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        try:  # interface names have at most 15 characters: ffl + pid (hex, <= 8) + letter + v99
            self.base = f"{PREFIX}{self.owner:x}{next(_INSTANCES)}"
        except StopIteration:
            raise RuntimeError("at most 20 Links per process") from None
        self.bridge = f"{self.base}br"
        self.nodes: list[Node] = []
        self.procs: list[subprocess.Popen[Any]] = []
        self._served: list[Served] = []
        self._open = False
        self.subnet = 0

    # -- setup ------------------------------------------------------------------------------------
    def __enter__(self) -> Links:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"cannot make network namespaces: {reason}")
        cleanup_leftovers()
        self._open = True
        try:
            self.subnet = _free_subnet(self.owner % 254)
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def host_address(self) -> str:
        """The root namespace's address on the bridge (where the client sits)."""
        return f"{_SUBNET}.{self.subnet}.1"

    def add_node(self, rate_mbit: float | None = None, *, burst_kb: int = 64, latency_ms: int = 50) -> Node:
        """A new namespace joined to the bridge; its outgoing link capped at ``rate_mbit`` (None: uncapped)."""
        if not self._open:
            raise RuntimeError("use Links as a context manager (`with Links() as links:`)")
        k = len(self.nodes) + 2
        if k > 99:
            raise RuntimeError("at most 98 nodes per Links")
        node = Node(k - 2, f"{self.base}n{k}", f"{_SUBNET}.{self.subnet}.{k}", f"{self.base}p{k}", f"{self.base}v{k}")
        self.nodes.append(node)
        _run("ip", "netns", "add", node.netns)
        _run("ip", "link", "add", node.host_dev, "type", "veth", "peer", "name", node.dev)
        _run("ip", "link", "set", node.dev, "netns", node.netns)
        _run("ip", "link", "set", node.host_dev, "master", self.bridge)
        _run("ip", "link", "set", node.host_dev, "up")
        _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", node.dev)
        _run("ip", "-n", node.netns, "link", "set", node.dev, "up")
        _run("ip", "-n", node.netns, "link", "set", "lo", "up")
        if rate_mbit is not None:
            self.shape(node, rate_mbit, burst_kb=burst_kb, latency_ms=latency_ms)
        return node

    def shape(self, node: Node, rate_mbit: float, *, burst_kb: int = 64, latency_ms: int = 50) -> None:
        """Cap (or re-cap) what ``node`` sends at ``rate_mbit`` Mbit/s with a token bucket filter."""
        if rate_mbit <= 0:
            raise ValueError(f"rate_mbit is {rate_mbit}; it must be > 0")
        verb = "change" if node.rate_mbit is not None else "add"
        _run(
            "tc", "-n", node.netns, "qdisc", verb, "dev", node.dev, "root", "tbf",
            "rate", f"{rate_mbit:g}mbit", "burst", f"{burst_kb}kb", "latency", f"{latency_ms}ms",
        )  # fmt: skip
        node.rate_mbit = rate_mbit

    def qdisc(self, node: Node) -> str:
        """``tc qdisc show`` of the node's link (what the cap is, for checks and reports)."""
        return _run("tc", "-n", node.netns, "qdisc", "show", "dev", node.dev).stdout

    # -- processes --------------------------------------------------------------------------------
    def popen(self, node: Node, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``argv`` started inside ``node``'s namespace (stopped when the Links close)."""
        env = dict(kwargs.pop("env", None) or os.environ)
        path = [str(_ROOT / d) for d in ("server", "client", "proto_schemas")] + [str(_ROOT)]
        env["PYTHONPATH"] = os.pathsep.join([*path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.setdefault("AWS_EC2_METADATA_DISABLED", "true")
        proc: subprocess.Popen[Any] = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, *argv], env=env, **kwargs
        )
        self.procs.append(proc)
        return proc

    def serve(
        self,
        node: Node,
        datasets: Mapping[str, str | os.PathLike[str]],
        *extra: str,
        port: int = 8815,
        script: Sequence[str] | None = None,
        timeout: float = 60.0,
    ) -> Served:
        """``flightfeed serve NAME=DIR ... --host ADDRESS --port PORT --no-sidecar EXTRA`` in ``node``;
        returns once it printed its location. ``script`` replaces ``python -m flightfeed.server``
        (e.g. a bench node script that registers a transform first)."""
        head = list(script) if script is not None else [sys.executable, "-m", "flightfeed.server"]
        args = [*head, "serve", *(f"{k}={v}" for k, v in datasets.items())]
        args += ["--host", node.address, "--port", str(port), *extra]
        if "--sidecar-port" not in extra and "--no-sidecar" not in extra:
            args.append("--no-sidecar")
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed in close())
        proc = self.popen(node, args, stdout=subprocess.PIPE, stderr=log, text=True, cwd=_ROOT)
        served = Served(node, proc, "", log)
        self._served.append(served)
        served.location = _ready(proc, served.lines, timeout) or ""
        if not served.location:
            raise RuntimeError(f"flightfeed serve in {node.netns} did not start:\n{served.output()}")
        return served

    def stop(self, served: Served, sig: int = signal.SIGINT, timeout: float = 15.0) -> None:
        """Stop one served node (SIGINT: graceful; SIGKILL: a crash)."""
        _stop(served.proc, sig, timeout)

    # -- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every process, delete the namespaces and the bridge (safe to call twice)."""
        for proc in self.procs:
            _stop(proc, signal.SIGINT, 10.0)
        for node in self.nodes:
            for pid in _run("ip", "netns", "pids", node.netns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", node.netns, check=False)
            _run("ip", "link", "del", node.host_dev, check=False)
        if self._open:
            _run("ip", "link", "del", self.bridge, check=False)
        for served in self._served:
            with contextlib.suppress(Exception):
                served.log.close()
        self.procs, self._served, self.nodes, self._open = [], [], [], False

    def leftovers(self) -> list[str]:
        """Names of this Links' namespaces and links that still exist (empty after close)."""
        names = [n.split(" ", 1)[0] for n in _run("ip", "netns", "list", check=False).stdout.split("\n")]
        devs = os.listdir("/sys/class/net") if os.path.isdir("/sys/class/net") else []
        return [x for x in [*names, *devs] if x.startswith(self.base)]


def _stop(proc: subprocess.Popen[Any], sig: int, timeout: float) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()


def _ready(proc: subprocess.Popen[str], seen: list[str], timeout: float) -> str | None:
    """The location ``flightfeed serve`` prints (``flight: grpc://...``), or None if it exits first."""
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    out = proc.stdout

    def pump() -> None:
        for line in out:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True, name="netns-serve-output").start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            return None
        seen.append(line)
        if line.startswith("flight: "):
            return line.split()[1]
    return None


# -- one namespace joined by a veth pair (no bridge, no caps) ------------------------------------



@dataclass
class Namespace:
    name: str
    host: str  # this side of the veth pair
    address: str  # the namespace's side: what its servers are dialled at
    procs: list[subprocess.Popen[str]] = field(default_factory=list)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _free_pair_subnet() -> tuple[str, str]:
    import pytest  # (only tests make a single namespace; benches import this module without pytest)

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
    import pytest

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
        ns.host, ns.address = _free_pair_subnet()
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
