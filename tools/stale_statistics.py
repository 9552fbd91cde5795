#!/usr/bin/env python3
"""How stale a one-computation DCCO run's statistics are (`--dcco_statistics=previous`): after each
round, the statistics it trained against (the previous round's aggregate) beside the statistics of the
weights it broadcast (what a two-phase round would have used), per statistic. Writes nothing; the run
folder only gives the config (docs/results.md, "Statistics losses").

  .venv/bin/python tools/stale_statistics.py runs/stats/cells/dcco_previous/noniid_1 40

FIELD=VALUE settings after ROUNDS override the run's (e.g. server_learning_rate=0.0002;
dcco_statistics=current prints a two-phase run's spreads for comparison); FIXED_CLIENTS=1 in the
environment trains every round on round 0's clients (staleness of the weights alone).

Prints per round: the loss, and for each statistic ||previous - current|| / ||current||; for the
per-dimension means, also the largest |mean| over the median standard deviation (features drifting
away from zero faster than the statistics follow).
"""

import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_ssl import runtime  # noqa: E402

runtime.install()  # Before TFF is imported: no orphan worker on any exit path.

import numpy as np  # noqa: E402

from tff_ssl import experiment, runner, tables  # noqa: E402
from tff_ssl.federated import common, grouping  # noqa: E402
from tff_ssl.methods import dcco  # noqa: E402


def main(argv) -> int:
  if len(argv) < 3:
    print(__doc__, file=sys.stderr)
    return 2
  run_dir, rounds = argv[1], int(argv[2])
  try:
    config = dataclasses.replace(experiment.load_config(run_dir),
                                 **tables.parse_settings(argv[3:]))
    if "dcco_statistics" not in config.method_entry.field_names:  # What the tool reads.
      raise ValueError(f"{run_dir} is a --method={config.method} run, whose method reads no "
                       f"--dcco_statistics; give a DCCO run folder")
    fresh = config.dcco_statistics == "current"  # Two phases: the spreads alone, for comparison.
    train, _ = experiment.load_splits(config)
    runtime.configure_context()
    _, model, process, round_clients = runner._setup(  # pylint: disable=protected-access
        config, train, runner.partition(config, train))
    state, last = process.initialize(), None
    for r in range(rounds):
      _, clients = round_clients(0 if os.environ.get("FIXED_CLIENTS") else r)
      previous = state.method_state
      line = ""
      if fresh or process.has_previous(state):
        data = (grouping.pack(clients, process.simulation.group_size)
                if process.simulation.grouped else clients)
        current = process.aggregate_statistics(common.flat_weights(state.weights),
                                               common.round_seed(config.seed, r), data)
        # Two phases: against the round before's statistics, what a stale round would have used.
        before = last if fresh else previous["statistics"]
        stats, gaps = current["statistics"], []
        for name, now in stats.items():
          if before is None:
            break
          now, then = np.asarray(now, np.float64), np.asarray(before[name])
          gaps.append(f"{name} {np.linalg.norm(then - now) / max(np.linalg.norm(now), 1e-30):.3f}")
        if dcco.has_variances(stats):
          var = np.maximum(np.asarray(dcco.variances(stats)[0]), 0)
          std = np.maximum(np.sqrt(var), 1e-30)
          drift = np.abs(np.asarray(stats["mean_f"])).max() / np.median(std)
          gaps.append(f"max |mean_f| / median std {drift:.1f}, std of f min / median / max "
                      f"{std.min():.3g} / {np.median(std):.3g} / {std.max():.3g}")
          if before is not None:  # How far off a one-round-old mean centres, in standard deviations.
            shift = np.abs(np.asarray(stats["mean_f"]) - np.asarray(before["mean_f"])) / std
            gaps.append(f"median |mean_f shift| / std {np.median(shift):.3g}")
        last = stats
        line = ", " + ", ".join(gaps)
      state, metrics = process.next(state, clients)
      print(f"round {r}: loss {float(metrics['loss']):.4g}{line}", flush=True)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
