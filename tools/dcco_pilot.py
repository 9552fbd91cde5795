#!/usr/bin/env python3
"""A validation pilot of one DCCO row of the `dcco_statistics` mini table (issue 52: remedies for
one-computation DCCO's stale statistics), on its non-IID 1 column: train minus a 10% stratified
validation split (54,000 one-image clients), scored by the run's own probe on that split, never the
test split. Appends one line to PILOTS/summary.txt.

  .venv/bin/python tools/dcco_pilot.py PILOTS ROW [FIELD=VALUE ...]
  .venv/bin/python tools/dcco_pilot.py runs/dcco_pilots dcco_previous rounds=1000 \\
      dcco_variance_anchor=10 dcco_mean_anchor=1        # ~3 min on 2 cores

PILOTS: the folder of the runs; ROW: dcco or dcco_previous (the table's row); FIELD=VALUE: settings
over the row's (bin/train's flags without --), e.g. rounds (the cosine decay's length too),
server_learning_rate, dcco_mean_anchor, dcco_variance_anchor, dcco_refresh_every, seed.
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
from tff_ssl import experiment, tables  # noqa: E402


def main(argv) -> int:
  if len(argv) < 3:
    print(__doc__, file=sys.stderr)
    return 2
  pilots, row, settings = argv[1], argv[2], tables.parse_settings(argv[3:])
  table = tasks.get_table("dcco_statistics", "mini")
  config = dataclasses.replace(
      table.cell_config(table.row(row), table.column("noniid_1")), validation_fraction=0.1,
      num_clients=54_000, eval_every=0, **settings)
  name = "_".join([row] + [f"{k}={v}" for k, v in sorted(settings.items())])
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
