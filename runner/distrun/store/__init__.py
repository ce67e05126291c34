"""What stays on the controller: one private record per run, the controller process that follows it,
and the images pushed to each inventory's nodes.

(DEVELOPING.md's module table has this text as the row of `store/`.)
"""
