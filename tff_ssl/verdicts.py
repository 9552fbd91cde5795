"""The verdict rule of a table's claims, declared before the runs (issue 72).

A claim compares two rows of a table ("B is above A", "B is within 3 points of A", "B is at least 4
points above A"). Each training seed gives the two rows the same clients, partitions and
initialization, so the claim is read on **paired differences**: per training seed, the mean over
label seeds of (B - A), in points. Label seeds re-draw only the probe's labelled subset of one
trained encoder, so they are not independent replicates of training; averaging them within a seed
keeps the interval's n the number of training runs.

The interval: Student's t over the training seeds, mean +- t(0.95, n - 1) * s / sqrt(n), a 90%
two-sided interval (n >= 2). One tie margin T (points) per table, the same for every claim of it.

- "above": holds when the interval is above +T, fails when below -T, tie when inside [-T, +T],
  inconclusive when it straddles +T or -T.
- "at_least" (B is not below A): holds when the interval is above -T (a tie is what it claims),
  fails when below -T, else inconclusive.
- "within" w points: holds when the interval is inside [-w, +w], fails when wholly outside it,
  else inconclusive (the claim's own w, not T).
- "by" X points (a magnitude, "by a significant margin", "+4.8"): holds when the interval is at
  least X, fails when wholly below X, else inconclusive.
- untested: fewer than MIN_SEEDS training seeds with both rows, or a reason the caller gives (a row
  below the gate, a failed run).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from scipy import stats

VERDICTS = ("holds", "fails", "tie", "inconclusive", "untested")
RELATIONS = ("above", "at_least", "within", "by")
LEVEL = 0.90  # Two-sided.
MIN_SEEDS = 2  # A t interval needs two; the tables aim at three.
METHOD = (f"paired differences, the mean over label seeds per training seed; a {LEVEL:.0%} "
          f"Student-t interval over training seeds")


@dataclasses.dataclass(frozen=True)
class Interval:
  """The mean paired difference and its interval, in points, over `seeds` training seeds."""

  mean: float
  low: float
  high: float
  seeds: int

  def text(self) -> str:
    return f"{self.mean:+.1f} [{self.low:+.1f}, {self.high:+.1f}] (n = {self.seeds})"


def paired_differences(better: Mapping[tuple[int, int], float],
                       base: Mapping[tuple[int, int], float]) -> dict[int, float]:
  """{training seed: mean over label seeds of better - base, in points} from accuracies (fractions)
  keyed by (training seed, label seed); only the pairs both rows have, and a seed only where both
  rows have the same label seeds at it (a difference over other label subsets is not paired)."""
  out = {}
  for seed in sorted({s for s, _ in better} | {s for s, _ in base}):
    labels_a = {l for s, l in better if s == seed}
    labels_b = {l for s, l in base if s == seed}
    if not labels_a or labels_a != labels_b:
      continue
    out[seed] = math.fsum(100.0 * (better[(seed, l)] - base[(seed, l)])
                          for l in sorted(labels_a)) / len(labels_a)
  return out


def interval(per_seed: Mapping[int, float], level: float = LEVEL) -> Interval | None:
  """The t interval of the per-seed differences; None under MIN_SEEDS seeds."""
  values = [float(v) for v in per_seed.values()]
  n = len(values)
  if n < MIN_SEEDS:
    return None
  mean = math.fsum(values) / n
  sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
  half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
  return Interval(mean, mean - half, mean + half, n)


def verdict(iv: Interval | None, relation: str, tie: float, amount: float = 0.0) -> str:
  """One of VERDICTS for a claim of `relation` on interval `iv` (points): `tie` is the table's margin,
  `amount` the claim's own number ("within" w, "by" X)."""
  if relation not in RELATIONS:
    raise ValueError(f"relation {relation!r} is not one of {RELATIONS}")
  if tie < 0:
    raise ValueError(f"the tie margin must be >= 0 points; got {tie}")
  if relation == "within" and amount <= 0:
    raise ValueError(f"'within' needs a positive number of points; got {amount}")
  if iv is None:
    return "untested"
  if relation == "above":
    if iv.low > tie:
      return "holds"
    if iv.high < -tie:
      return "fails"
    if -tie <= iv.low and iv.high <= tie:
      return "tie"
    return "inconclusive"
  if relation == "at_least":
    if iv.low >= -tie:
      return "holds"
    return "fails" if iv.high < -tie else "inconclusive"
  if relation == "within":
    if -amount <= iv.low and iv.high <= amount:
      return "holds"
    return "fails" if iv.low > amount or iv.high < -amount else "inconclusive"
  if iv.low >= amount:  # "by"
    return "holds"
  return "fails" if iv.high < amount else "inconclusive"


def check(better: Mapping[tuple[int, int], float], base: Mapping[tuple[int, int], float],
          relation: str, tie: float, amount: float = 0.0) -> tuple[str, Interval | None, str]:
  """(verdict, interval, why it is untested or ""), from the two rows' accuracies keyed by (training
  seed, label seed)."""
  per_seed = paired_differences(better, base)
  iv = interval(per_seed)
  why = ("" if iv is not None else
         f"{len(per_seed)} paired training seed{'s' if len(per_seed) != 1 else ''}; the rule needs "
         f"{MIN_SEEDS}")
  return verdict(iv, relation, tie, amount), iv, why
