"""The helper process of :mod:`._info_helper`: one ``get_flight_info`` by path, answered as JSON.

Run as a script (``python .../info_child.py``), not as a module of the package: importing
``flightfeed.client`` would import torch (seconds), and this process needs only pyarrow. It reads
one JSON request from stdin (``path``: the parent's ``sys.path``; ``locations`` in the order to
try; ``name``; ``command``: a serialized ``ReadCommand`` as base64 to ask for it instead of the
dataset's path (a packed read's windows); ``token``; ``tls_root_certs``; ``timeout``; ``retry_s``:
how long to keep going over the locations when none answers, 0 for one round) and prints one JSON
line: ``{"location", "rows", "schema", "ticket"}`` (the schema as base64 Arrow IPC, ``ticket`` the
first endpoint's ticket as base64 or null) or ``{"errors": [{"location", "kind", "message"}]}``
(``kind``: the pyarrow exception class). Nothing here is pickled.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

__all__ = ["ask", "main"]


def ask(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to ``request`` (see the module doc)."""
    import pyarrow.flight as flight

    headers: Any = [(b"authorization", f"Bearer {request['token']}".encode())] if request.get("token") else None
    options = flight.FlightCallOptions(timeout=request.get("timeout"), headers=headers)
    certs = request.get("tls_root_certs")
    command = request.get("command")
    descriptor = (
        flight.FlightDescriptor.for_command(base64.b64decode(command))
        if command
        else flight.FlightDescriptor.for_path(request["name"])
    )
    deadline = time.monotonic() + float(request.get("retry_s") or 0.0)
    errors: dict[str, dict[str, str]] = {}
    while True:
        for location in request["locations"]:
            kwargs: dict[str, Any] = {"tls_root_certs": certs.encode("latin-1")} if certs else {}
            try:
                client = flight.FlightClient(location, **kwargs)
                try:
                    info = client.get_flight_info(descriptor, options)
                finally:
                    client.close()
            except Exception as exc:  # every failure is reported, by class, to the parent
                errors[location] = {"location": location, "kind": type(exc).__name__, "message": str(exc)}
                if not isinstance(exc, flight.FlightUnavailableError | flight.FlightTimedOutError):
                    return {"errors": list(errors.values())}  # a server answered with an error
                continue
            schema = base64.b64encode(info.schema.serialize().to_pybytes()).decode()
            first = info.endpoints[0].ticket.ticket if info.endpoints else None
            ticket = base64.b64encode(first).decode() if first is not None else None
            return {"location": location, "rows": int(info.total_records), "schema": schema, "ticket": ticket}
        if time.monotonic() >= deadline:
            return {"errors": list(errors.values())}
        time.sleep(0.5)


def main() -> None:
    request = json.loads(sys.stdin.readline())
    sys.path[:0] = [p for p in request.get("path", []) if p not in sys.path]
    sys.stdout.write(json.dumps(ask(request)) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
