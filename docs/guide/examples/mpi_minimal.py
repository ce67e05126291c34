"""A minimal mpi4py program for distrun's mpirun launcher.

    distrun train -i prod --script docs/guide/examples/mpi_minimal.py

Under mpirun (and slurm) distrun starts Python as `python -m mpi4py mpi_minimal.py`: an
exception or a non-zero exit on any rank calls MPI_Abort and ends the whole job at once.
"""

from __future__ import annotations

import json
import os
import socket

from mpi4py import MPI


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # The same numbers the rank wrapper exported (from OMPI_COMM_WORLD_*).
    assert rank == int(os.environ["RANK"]) and size == int(os.environ["WORLD_SIZE"])
    hosts = comm.gather(socket.gethostname(), root=0)
    total = comm.allreduce(rank, op=MPI.SUM)
    if rank == 0:
        print(f"{size} ranks on {sorted(set(hosts))}; sum of ranks {total}", flush=True)
        print("DISTRUN_RESULT " + json.dumps({"workload": "mpi_minimal", "ranks": size, "rank_sum": total}), flush=True)


if __name__ == "__main__":
    main()
