"""The preflight's verdicts: what the nodes' probes mean per check and node, with the fix (network,
shared folder, ssh mesh, image, a site's Slurm), `check`'s report and the line that refuses a run.

(DEVELOPING.md's module table has this text as the row of `preflight/`.)
"""
