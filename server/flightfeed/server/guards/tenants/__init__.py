"""Tenants: who may read which datasets, with what share of a busy node (docs/security.md).

``table`` holds the checked tenants (salted token hashes, dataset patterns, limits); ``tenants_file``
reads and checks the ``--tenants`` TOML file; ``rewrite`` turns plain tokens in it into salted
hashes in place; ``registry`` keeps the current table, reloads it on SIGHUP or a change of the file
and says whether a running stream may go on; ``middleware`` identifies the caller of every Flight
call; ``access`` is the service's check of a dataset, listing or action (refusals are
``PermissionDenied``, audited); ``fair`` is the weighted fair queue in front of making messages.
With ``--workers N`` the node's processes share one ledger (``ledger_file``): ``ledger`` keeps the
tenants' ``max_streams`` and ``max_bytes_per_s`` for the node, ``node_queue`` the fair queue's
virtual times.
"""

__all__: list[str] = []
