"""``len(ds)`` / ``ds.info()`` in a process that must stay free of gRPC: ask from a helper process
(for a packed read, ``len(ds)`` asks for the read's own tickets: they count the epoch's windows).

gRPC is not fork-safe (:mod:`._fork`): once a process made a Flight client, the DataLoader
workers it forks hang. A training script calls ``len(train_loader)`` (a progress bar, an LR
schedule) before its workers start; answered here, in the parent, that call would poison the
``fork`` workers that follow. So while this process has never used Flight (and is not itself a
DataLoader worker), :func:`info_via_helper` runs the ``get_flight_info`` in a short-lived child
Python (``sys.executable`` running :mod:`._info_child` as a script, started with ``subprocess``:
a fresh interpreter that imports only pyarrow, not a fork) and reads the answer back as JSON (the
schema as Arrow IPC bytes; no pickle). The parent never touches gRPC; the dataset caches the
answer like any other. Once this process uses Flight itself, the call is made directly.

The child gets its request on stdin (the token never appears on a command line). Its errors come
back by pyarrow class and message and go through the client's error boundary here, as the direct
call's would: a server's tagged error is raised as that flightfeed error, locations that never
answered are a :class:`ConfigError` naming each one's error. Locations that answered are marked as
answered in this process (a later outage is then retried, not taken for a typo). Cost: one Python
start-up and a pyarrow import (under a second on an idle core), once per dataset.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.client._connect.boundary import reached_server, retryable, translate
from flightfeed.client._connect.dial import never_answered, with_token_hint
from flightfeed.client._connect.info import describe
from flightfeed.client._connect.members import Members
from flightfeed.client._options import ConnectOptions
from flightfeed.client._state.fork import grpc_used
from flightfeed.wire.errors import StreamError, Unauthenticated
from flightfeed.wire.messages import StreamTicket

__all__ = ["info_via_helper", "helper_needed", "windows_via_helper"]

_CHILD = Path(__file__).with_name("info_child.py")
_SLACK_S = 60.0  # beyond the connect budget: the child's start-up on a loaded machine


def helper_needed() -> bool:
    """Whether a call here must avoid gRPC: a main process (not a DataLoader worker) that never used it."""
    import torch.utils.data

    return not grpc_used() and torch.utils.data.get_worker_info() is None


def info_via_helper(
    members: Members, connect: ConnectOptions, name: str, columns: Sequence[str]
) -> dict[str, Any]:
    """:func:`._info.dataset_info`'s answer, asked by a child process (this one stays gRPC-free)."""
    answer = _ask(members, connect, f"get_flight_info for dataset {name!r}", {"name": name})
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(answer["schema"])))
    return describe(schema, int(answer["rows"]), name, columns)


def windows_via_helper(members: Members, connect: ConnectOptions, cmd: Any) -> int:
    """The packed windows of an epoch of ``cmd`` (a ``ReadCommand`` with ``pack``: what its tickets
    count, ``StreamTicket.num_rows``), asked by a child process (this one stays gRPC-free)."""
    what = f"get_flight_info for dataset {cmd.dataset!r}"
    answer = _ask(members, connect, what, {"name": cmd.dataset, "command": base64.b64encode(
        cmd.SerializeToString()).decode()})
    ticket = answer.get("ticket")
    return int(StreamTicket.FromString(base64.b64decode(ticket)).num_rows) if ticket else 0


def _ask(members: Members, connect: ConnectOptions, what: str, ask: dict[str, Any]) -> dict[str, Any]:
    """The child's answer to ``ask`` (``name``, optionally ``command``) over ``members``' order;
    its errors raised as the direct call's would be."""
    order = members.order()
    retry = any(members.ever_answered(m) for m in order)  # an outage, not a configuration error
    request = {
        "path": [p for p in sys.path if isinstance(p, str)],
        "locations": order,
        **ask,
        "token": connect.token,
        "tls_root_certs": connect.tls_root_certs.decode("latin-1") if connect.tls_root_certs else None,
        "timeout": connect.timeout,
        "retry_s": float(connect.retry_timeout) if retry else 0.0,
    }
    budget = float(connect.retry_timeout) + (connect.timeout or 0.0) + _SLACK_S
    try:
        done = subprocess.run(
            [sys.executable, str(_CHILD)], input=json.dumps(request) + "\n", capture_output=True,
            text=True, timeout=budget, check=False,
        )
    except subprocess.TimeoutExpired:
        raise StreamError(
            f"{what}: the helper process (asking without gRPC here) did not answer in {budget:.0f}s"
        ) from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = " | ".join((done.stderr or "").strip().splitlines()[-5:]) or "no output"
        raise StreamError(
            f"{what}: the helper process ({sys.executable} {_CHILD.name}) that asks without using gRPC here "
            f"exited with status {done.returncode}: {tail}"
        )
    answer: dict[str, Any] = json.loads(lines[-1])
    if "errors" in answer:
        raise _error(what, answer["errors"], members)
    members.answered(str(answer["location"]))
    return answer


def _error(what: str, errors: list[dict[str, str]], members: Members) -> BaseException:
    """The error the direct call would have raised for the child's failures (``_dial``'s rules)."""
    seen: dict[str, str] = {}
    for e in errors:
        cls = getattr(flight, e["kind"], None)
        known = isinstance(cls, type) and issubclass(cls, pa.ArrowException)
        raw: Exception = cls(e["message"]) if known else StreamError(e["message"])  # type: ignore[misc]
        err = translate(raw)
        if err is not raw:
            err.__cause__ = raw  # reached_server looks at the cause (unavailable: never reached)
        if reached_server(err):
            members.heard(e["location"])
        if not retryable(err):
            if isinstance(err, Unauthenticated):
                return with_token_hint(err)
            return err
        members.failed(e["location"])
        seen[e["location"]] = (e["message"].strip().splitlines() or [e["kind"]])[0]
    if not any(members.ever_answered(m) for m in seen):
        return never_answered(what, seen)
    tried = "; ".join(f"{k}: {v}" for k, v in seen.items())
    return StreamError(f"{what}: no member answered within retry_timeout ({tried})")
