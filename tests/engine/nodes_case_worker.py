"""One machine rank's process of tests/engine/test_several_nodes.py; not a test module itself.

Run by ``accelerate launch --num_machines 2 --machine_rank R ...`` as
``nodes_case_worker.py CASE OUT_DIR``: the case of the two-process worker (tests/dist_worker.py)
in the process group that the two launchers set up (``env://``: rank, world size and the
rendezvous at the main machine's address and port come from the launcher), instead of a file
store the ranks share.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # dist_worker, as the cases import it
from dist_worker import run_case  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(1)
    run_case(sys.argv[1], int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
             Path(sys.argv[2]), init_method="env://")
