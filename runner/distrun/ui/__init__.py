"""What a person or a script is shown: the console, the terminal views of a run and of run records, the
run records as JSON objects.

(DEVELOPING.md's module table has this text as the row of `ui/`.)
"""
