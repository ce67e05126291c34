"""A user's project made ready before its run: the workdir sent to the head by git's ignore rules,
`--prepare` run there.

(DEVELOPING.md's module table has this text as the row of `project/`.)
"""
