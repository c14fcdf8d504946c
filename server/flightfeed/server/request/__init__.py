"""The request path: where a trainer's call enters and how its stream is made.

``service`` is the Flight service (``get_flight_info``, ``do_get``, actions); every call goes
through ``guards`` first. ``streaming`` turns a validated ticket into the stream's message plan
and produces each message from the dataset (``data``) with ``gather`` (per-chunk row gathers and
zero-copy slices), optionally transformed (``transforms``); ``shared_messages`` is the shared-jobs
window (messages made once for identical requests, ``--share-window``) and ``identity`` says
when two requests are identical. Nothing here observes: counters go to ``observe``.
"""

__all__: list[str] = []
