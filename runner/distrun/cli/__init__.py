"""The command line: the verbs, their options and what each value may be, the mistakes told in one line
with the fix and exit 2, which verb runs what.

(DEVELOPING.md's module table has this text as the row of `cli/`.)
"""
