"""Guards: what a request must pass before, and while, it is served.

``tenants`` identifies every call's tenant and checks what it may read, reloads the tenants
file and shares a busy node by weight (docs/security.md); ``auth`` checks the sidecar's token,
``limits`` range-checks every request against the server's caps (message size, streams),
``budget`` bounds the bytes in flight overall and per client address, ``exposure`` warns when a
node listens beyond loopback unprotected, and ``boundary`` is the one place where the
``flightfeed.wire.errors`` tree is translated into Flight errors (with an error id for anything
unexpected).
"""

__all__: list[str] = []
