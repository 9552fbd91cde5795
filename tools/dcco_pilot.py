#!/usr/bin/env python3
"""A validation pilot of one DCCO row of the `dcco_statistics` mini table (issue 52: remedies for
one-computation DCCO's stale statistics), on its non-IID 1 column: train minus a 10% stratified
validation split (54,000 one-image clients), scored by the run's own probe on that split, never the
test split. Appends one line to PILOTS/summary.txt.

  .venv/bin/python tools/dcco_pilot.py ROW ANCHOR ROUNDS LR [REFRESH] [PILOTS]
  .venv/bin/python tools/dcco_pilot.py dcco_previous 1.0 250 0.005 4     # ~1 min on 2 cores

ROW: dcco or dcco_previous; ANCHOR: --dcco_mean_anchor; ROUNDS: the run's length (its cosine decay
too); LR: server Adam's rate; REFRESH: --dcco_refresh_every (default 0); PILOTS: the folder of the
runs (default runs/dcco_pilots).
"""

import dataclasses
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_ssl import runtime  # noqa: E402

runtime.install()

import tasks  # noqa: E402
from tff_ssl import experiment  # noqa: E402


def main(argv) -> int:
  if len(argv) < 5:
    print(__doc__, file=sys.stderr)
    return 2
  row, anchor, rounds, lr = argv[1], float(argv[2]), int(argv[3]), float(argv[4])
  refresh = int(argv[5]) if len(argv) > 5 else 0
  pilots = argv[6] if len(argv) > 6 else os.path.join("runs", "dcco_pilots")
  table = tasks.get_table("dcco_statistics", "mini")
  config = dataclasses.replace(
      table.cell_config(table.row(row), table.column("noniid_1")), rounds=rounds,
      validation_fraction=0.1, num_clients=54_000, eval_every=0, dcco_mean_anchor=anchor,
      dcco_refresh_every=refresh, server_learning_rate=lr)
  name = f"{row}_anchor{anchor:g}_refresh{refresh}_rounds{rounds}_lr{lr:g}"
  start = time.time()
  try:
    result = experiment.run(config, os.path.join(pilots, name), progress=False,
                            random_init_baseline=False)
    line = (f"{name}: validation probe {result['linear_probe_accuracy_pretrained']:.4f}, final "
            f"loss {result['final_loss']:.4g}")
  except FloatingPointError as e:
    line = f"{name}: diverged ({e})".split(" in a new --output_dir")[0]
  line += f" ({time.time() - start:.0f} s)"
  print(line)
  os.makedirs(pilots, exist_ok=True)
  with open(os.path.join(pilots, "summary.txt"), "a") as f:
    f.write(line + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
