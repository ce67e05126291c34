"""Every rank fits y = w * x on its part; an allreduce averages the gradient each step.

    distrun train -i prod --workdir docs/guide/examples/project \
        --prepare 'python partition.py --num-parts {np} --out parts' \
        -- python -m mpi4py -m mypkg.train --config config.json
"""

import argparse
import os

from mpi4py import MPI

from mypkg.data import load_config, load_part

parser = argparse.ArgumentParser()
parser.add_argument("--config", default="config.json")
args = parser.parse_args()

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
config = load_config(args.config)
points = load_part(rank)
w = 0.0
for step in range(config["steps"]):
    grad = sum(2 * (w * x - y) * x for x, y in points)
    count = comm.allreduce(len(points))
    w -= config["lr"] * comm.allreduce(grad) / count
    if rank == 0 and (step + 1) % 10 == 0:
        print(f"step {step + 1}: w = {w:.4f}", flush=True)
if rank == 0:
    print(f"done on {world} ranks in {os.getcwd()}: w = {w:.4f} (NCCL_DEBUG={os.environ.get('NCCL_DEBUG')})", flush=True)
