"""Reading this rank's part and the config: plain files in the workdir, relative paths."""

import json


def load_config(path):
    with open(path) as f:
        return json.load(f)


def load_part(rank, folder="parts"):
    with open(f"{folder}/part-{rank}.csv") as f:
        return [tuple(float(x) for x in line.split(",")) for line in f if line.strip()]
