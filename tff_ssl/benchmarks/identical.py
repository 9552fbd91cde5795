"""A refactor's check: the same runs at two revisions of the project give byte-identical metrics.csv
and aggregation.csv (`bin/benchmark --identical_to=REV`; issue 73's acceptance).

Each round shape the project builds runs a few rounds of bin/train on synthetic images here and in a
git worktree of REV (same Python, same machine, one process each), and the two run folders' CSVs are
compared byte for byte. What a round computes is float32 arithmetic on one CPU, so a restructured
round that computes the same thing writes the same bytes; any difference names the run and file.
"""

from __future__ import annotations

import dataclasses
import filecmp
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = ("metrics.csv", "aggregation.csv")

_COMMON = ("--task=synthetic_dcco_smoke", "--eval_steps=5", "--rounds=3")
_CLIENTS = ("--num_clients=16", "--samples_per_client=16", "--clients_per_round=4",
            "--projector=32,16", "--client_learning_rate=0.05")
_VIT = ("--ssl=mocov3", "--encoder=vit_mini", "--patch_size=7", "--depth=1", "--width=0.5",
        "--predictor=32,16", "--temperature=0.2", "--server_optimizer=sgd",
        "--server_learning_rate=1.0", "--server_lr_schedule=constant")

# Every way a round is assembled: DCCO's (two phases, one with stale statistics, private, secure),
# FedAvg's and its stages', the layer-wise methods' and the heterogeneous one's.
RUNS = {
    "dcco": (),
    "dcco_stale": ("--dcco_statistics=previous",),
    "dcco_dp": ("--dp=gaussian_fixed", "--dp_noise_multiplier=0.5"),
    "dcco_secure": ("--secure_aggregation", "--simulation=reference"),
    "fedavg_simclr": ("--method=fedavg", "--ssl=simclr", *_CLIENTS),
    "fedavg_dp": ("--method=fedavg", "--ssl=simclr", "--dp=gaussian_fixed",
                  "--dp_noise_multiplier=0.5", *_CLIENTS),
    "fedbyol_fedfoa": ("--method=fedbyol", "--ssl=byol", "--fedfoa", "--fedfoa_warmup=0",
                       *_CLIENTS),
    "fedlama_fedfoa": ("--method=fedlama", "--ssl=byol", "--fedfoa", "--fedfoa_warmup=0",
                       *_CLIENTS),
    "fedx_fedu2": ("--method=fedavg", "--ssl=simclr", "--fedx", "--fedu2_fur", "--fedu2_eua",
                   *_CLIENTS),
    "lw_fedssl": ("--method=lw_fedssl", "--auxiliary_fraction=0.05", *_CLIENTS, *_VIT),
    "heterogeneous": ("--method=heterogeneous", "--ssl=byol", "--architectures=resnet8,vgg9",
                      "--width=0.25", *_CLIENTS),
    "heterogeneous_fedfoa": ("--method=heterogeneous", "--ssl=byol", "--fedfoa",
                             "--fedfoa_warmup=0", "--architectures=resnet8,vgg9", "--width=0.25",
                             *_CLIENTS),
}


@dataclasses.dataclass
class Outcome:
  run: str
  differing: tuple[str, ...]  # The files that differ (or are missing on one side).
  error: str = ""  # Where a side failed: its last line.

  @property
  def identical(self) -> bool:
    return not self.differing and not self.error


def _train(root: str, name: str, out: str) -> str:
  """Runs bin/train of the tree at `root` for `RUNS[name]` into `out`; '' or its last error line."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run([sys.executable, os.path.join(root, "bin", "train"), f"--output_dir={out}",
                         *_COMMON, *RUNS[name]], cwd=root, env=env, capture_output=True, text=True)
  if done.returncode:
    lines = (done.stderr or done.stdout).strip().splitlines()
    return f"{root}: exit {done.returncode}: {lines[-1] if lines else ''}"
  return ""


def _same(here: str, there: str, name: str) -> bool:
  """Whether the run folders hold the same file `name`, byte for byte (or both lack it)."""
  a, b = os.path.join(here, name), os.path.join(there, name)
  if not (os.path.exists(a) and os.path.exists(b)):
    return os.path.exists(a) == os.path.exists(b)
  return filecmp.cmp(a, b, shallow=False)


def compare(revision: str, runs=None, echo=print) -> list[Outcome]:
  """Each of `runs` (default all of `RUNS`) here and at git `revision`: their outcomes."""
  runs = list(runs or RUNS)
  unknown = [r for r in runs if r not in RUNS]
  if unknown:
    raise ValueError(f"unknown identity run(s) {unknown}; choose from {sorted(RUNS)}")
  outcomes = []
  with tempfile.TemporaryDirectory(prefix="identical_") as tmp:
    base = os.path.join(tmp, "base")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", base, revision],
                   check=True)
    try:
      for name in runs:
        sides = [os.path.join(tmp, side, name) for side in ("here", "there")]
        error = _train(ROOT, name, sides[0]) or _train(base, name, sides[1])
        differing = () if error else tuple(f for f in FILES if not _same(*sides, f))
        outcomes.append(Outcome(name, differing, error))
        echo(f"{name}: " + ("identical" if outcomes[-1].identical
                            else error or f"differs in {', '.join(differing)}"))
    finally:
      subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base], check=False)
  return outcomes
