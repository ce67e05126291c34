"""From a request and the inventory to a plan: the request and the dry run, what runs where, the hosts
chosen, the interfaces, the ranks' variables, the image, and what a run sends to its nodes.

(DEVELOPING.md's module table has this text as the row of `planning/`.)
"""
