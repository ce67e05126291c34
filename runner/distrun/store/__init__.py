"""What stays on the controller: one private record per run, the controller process that follows it,
the images pushed to each inventory's nodes, and the nodes drained out of its runs.

(DEVELOPING.md's module table has this text as the row of `store/`.)
"""
