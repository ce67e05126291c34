"""A user's project made ready before its run: the workdir sent to the head by git's ignore rules,
`--prepare` run there, an image handed to every node.

(DEVELOPING.md's module table has this text as the row of `project/`.)
"""
