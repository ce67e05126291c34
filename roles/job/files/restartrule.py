"""distrun's restart rule: after a failed attempt, on which hosts the next one runs, or why none
does. One home for the controller's follower (runner/distrun/run/restarts.py loads this file's
text) and the head's supervisor of a detached run (supervise.py, composed behind this file).

Pure: plain names and numbers in, a plain dict out; standard library only, Python 3.9 or newer.
What it is given is what distrun itself observed (a node that does not answer, a node its own
diagnosis named): never a file or a line of the job's.
"""


def restart_hosts(workers, used, head, np, world_size, failed, lost, exclude_failed):
    """The next attempt's hosts after a failure: {"exclude": [hosts left out], "refused": why or ""}.

    ``workers``: [[name, slots], ...] the hosts an attempt may use, in order; ``used``: the hosts
    of the failed attempt; ``np``: the --np asked (None: one rank per slot of the hosts left, so
    any one host left will do); ``world_size``: the failed attempt's ranks. A lost node (it does
    not answer) is left out when the user allowed it (--exclude-failed), a failed node too when
    the job still fits without it; the head, which starts the job, is never left out."""
    lost = set(lost)
    if head in lost:
        return {"exclude": [], "refused": f"the head node {head} is lost; a run cannot go on without it"}
    if lost and not exclude_failed:
        return {"exclude": [], "refused": f"{', '.join(sorted(lost))} cannot be reached; restart with --exclude-failed "
                                          "to go on without it, or bring it back and run the job again"}
    drop = set(lost)
    if exclude_failed and failed and failed != head and failed in set(used):
        drop.add(failed)
    left = [(n, s) for n, s in workers if n not in drop]
    slots = sum(int(s) for _, s in left)
    need = int(world_size) if np is not None else 1
    if slots >= need and left:
        return {"exclude": sorted(drop), "refused": ""}
    spared = drop - lost
    if spared and slots + sum(int(s) for n, s in workers if n in spared) >= need:
        return {"exclude": sorted(lost), "refused": ""}  # the failed node is reachable: the job fits only with it
    return {"exclude": [], "refused": f"--np {np} needs {need} slots; without {', '.join(sorted(drop))} only {slots} are left"}


def next_world_size(hosts, np):
    """The ranks of an attempt on ``hosts`` ([[name, slots], ...]): --np's, else one per slot."""
    return int(np) if np is not None else sum(int(s) for _, s in hosts)
