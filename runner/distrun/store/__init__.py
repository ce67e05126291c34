"""What stays on the controller: one private record per run and the controller process that follows it.

(DEVELOPING.md's module table has this text as the row of `store/`.)
"""
