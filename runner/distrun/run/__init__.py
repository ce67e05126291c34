"""A run from its claim to its end: the attempt's launch and follow, restarts, collect, the diagnosis,
a record reconciled with its nodes, and the verbs that act on a run on its nodes (attach, stop,
logs, fetch).

(DEVELOPING.md's module table has this text as the row of `run/`.)
"""
