"""``hpc-batchd``: the root daemon (its loop, engine, state, cgroups, shepherd launcher).

A long-lived process: it imports at start-up everything it will ever need, so
that a package upgraded under it is never half loaded (see docs/architecture.md).
The client never imports this package.
"""
