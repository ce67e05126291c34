"""Allreduce of rank+1 over all ranks; each rank prints: RANK <rank> <size> <hostname> <sum>."""
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
print(f"RANK {comm.Get_rank()} {comm.Get_size()} {socket.gethostname()} {total}", flush=True)
