"""The prepare step of this example: split data/points.csv into one part per rank.

distrun runs it once on the head, in the workdir, before the launch:
    --prepare 'python partition.py --num-parts {np} --out parts'
"""

import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--num-parts", type=int, required=True)
parser.add_argument("--out", default="parts")
args = parser.parse_args()

rows = [line for line in open("data/points.csv") if line.strip()]
os.makedirs(args.out, exist_ok=True)
for part in range(args.num_parts):
    with open(os.path.join(args.out, f"part-{part}.csv"), "w") as f:
        f.writelines(rows[part::args.num_parts])
print(f"wrote {args.num_parts} parts of {len(rows)} rows to {args.out}/", flush=True)
