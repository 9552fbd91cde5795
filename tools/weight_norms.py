#!/usr/bin/env python3
"""Per-round weight norms of a federated run's config: how an aggregation strategy changes the global
model's scale (docs/results.md, "The mini L-DAWA table"). Writes nothing; the run folder only gives the config.

  .venv/bin/python tools/weight_norms.py runs/l2/cells/ldawa/barlow_twins 8
  .venv/bin/python tools/weight_norms.py runs/l2/cells/ldawa/barlow_twins 8 aggregator=fedavg

Prints, after each round: the loss, the mean cosine between client and global models (`model_delta`,
strategies that measure it), and each kind of kernel's norm over its initial norm (mean over layers).
"""

import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_ssl import runtime  # noqa: E402

runtime.install()  # Before TFF is imported: no orphan worker on any exit path.


from tff_ssl import experiment, methods, tables  # noqa: E402
from tff_ssl import runner  # noqa: E402
from tff_ssl.federated import common  # noqa: E402


def main(argv) -> int:
  if len(argv) < 3:
    print(__doc__, file=sys.stderr)
    return 2
  run_dir, rounds = argv[1], argv[2]
  try:
    config = dataclasses.replace(experiment.load_config(run_dir),
                                 **tables.parse_settings(argv[3:]))
    if not methods.get(config.method).federated:
      raise ValueError(f"{run_dir} is a {config.method} run; weight norms per round need a "
                       f"federated run")
    train, _ = experiment.load_splits(config)
    # bin/train's context (TFF's static Grappler pass as TFF_SSL_STATIC_GRAPH_OPTIMIZATION says):
    # the same graphs, so the same losses up to the float round-off of another process.
    runtime.configure_context()
    for r, model, weights, metrics in runner.trajectory(config, train, int(rounds)):
      delta = (metrics.get("aggregation") or {}).get("model_delta")
      norms = common.kernel_norms(model.names, model.initial_weights, weights)
      ratios = {k[len("kernel_norm_"):]: v for k, v in norms.items() if k.startswith("kernel_norm_")}
      print(f"round {r}: loss {float(metrics['loss']):.2f}"
            + (f", model_delta {float(delta):.3f}" if delta is not None else "")
            + "".join(f", {k} kernel norm / initial {v:.3f}" for k, v in ratios.items()),
            flush=True)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
