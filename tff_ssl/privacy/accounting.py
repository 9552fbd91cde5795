"""Privacy accounting of a run's releases with `dp_accounting`'s RDP accountant.

A round samples `sample_size` of the `population` clients and releases, from exactly those clients,
one or more Gaussian sums (FedAvg-style: the update; DCCO: the statistics, then the update), each of
a per-client L2 clip C and noise standard deviation sigma * C. The round's event is

    fixed-size sampling (the runner's: `tff.simulation.build_uniform_sampling_fn`, no replacement)
        SampledWithoutReplacementDpEvent(population, sample_size,
                                         ComposedDpEvent([Gaussian(sigma / 2)] * releases))
    Poisson sampling (each client independently with q = sample_size / population)
        PoissonSampledDpEvent(q, ComposedDpEvent([Gaussian(sigma)] * releases))

Fixed-size sampling is analysed under "replace one client" neighbouring datasets (the population
size is public): replacing a client moves a clipped sum by up to 2C, so a release of noise sigma * C
is a Gaussian mechanism of noise multiplier sigma / 2 relative to its sensitivity. Poisson sampling
is analysed under "add or remove one client" (sensitivity C). The rounds compose: the RDP of r
identical rounds is r times one round's, so `Ledger` computes each distinct round's RDP once and
epsilon per round costs a conversion, not a re-analysis (0.3 s an event here).

delta defaults to 1 / population (`default_delta`).
"""

from __future__ import annotations

import collections
import functools
import math
from typing import Sequence

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

SAMPLINGS = ("fixed", "poisson")


def _relation(sampling: str):
  if sampling not in SAMPLINGS:
    raise ValueError(f"unknown client sampling {sampling!r}; choose one of {list(SAMPLINGS)}")
  rel = dp_accounting.NeighboringRelation
  return rel.REPLACE_ONE if sampling == "fixed" else rel.ADD_OR_REMOVE_ONE


def default_delta(population: int) -> float:
  return 1.0 / population


def scaled(event: dp_accounting.DpEvent, scale: float) -> dp_accounting.DpEvent:
  """`event` with every Gaussian noise multiplier times `scale` (a sensitivity of 1 / scale)."""
  if isinstance(event, dp_accounting.GaussianDpEvent):
    sigma = float(event.noise_multiplier)
    return (dp_accounting.GaussianDpEvent(scale * sigma) if sigma > 0
            else dp_accounting.NonPrivateDpEvent())
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return dp_accounting.ComposedDpEvent([scaled(e, scale) for e in event.events])
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return dp_accounting.SelfComposedDpEvent(scaled(event.event, scale), event.count)
  return event


def noise_multiplier(event: dp_accounting.DpEvent) -> float:
  """The single Gaussian noise multiplier equivalent to `event` (for reporting): a Gaussian's own;
  a composition of Gaussians (gaussian_adaptive's values and clipped count) 1 / sqrt(sum of
  1 / sigma_i^2), the total sigma TFF split between them; 0 without noise; nan otherwise."""
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return float(event.noise_multiplier)
  if isinstance(event, dp_accounting.NonPrivateDpEvent):
    return 0.0
  parts = (list(event.events) if isinstance(event, dp_accounting.ComposedDpEvent) else
           [event.event] * event.count if isinstance(event, dp_accounting.SelfComposedDpEvent)
           else None)
  if parts is None:
    return math.nan
  sigmas = [noise_multiplier(e) for e in parts]
  if any(math.isnan(x) for x in sigmas) or not sigmas:
    return math.nan
  return 0.0 if min(sigmas) == 0 else sum(x ** -2 for x in sigmas) ** -0.5


def _non_private(event) -> bool:
  if isinstance(event, dp_accounting.NonPrivateDpEvent):
    return True
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return any(_non_private(e) for e in event.events)
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return _non_private(event.event)
  return False


def sampled_round(events: Sequence[dp_accounting.DpEvent], population: int, sample_size: int,
                  sampling: str = "fixed") -> dp_accounting.DpEvent:
  """A round's event from the events its releases report (each relative to its clip, as TFF's DP
  factory records them): the releases composed, scaled to the sampling's sensitivity, sampled."""
  if not 1 <= sample_size <= population:
    raise ValueError(f"a round samples 1 to {population} clients; got {sample_size}")
  _relation(sampling)
  events = [scaled(e, 0.5 if sampling == "fixed" else 1.0) for e in events]
  if any(_non_private(e) for e in events):  # A release without noise: no guarantee at all.
    return dp_accounting.NonPrivateDpEvent()
  inner = events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
  if sampling == "fixed":
    return dp_accounting.SampledWithoutReplacementDpEvent(population, sample_size, inner)
  return dp_accounting.PoissonSampledDpEvent(sample_size / population, inner)


def round_event(noise_multipliers: Sequence[float], population: int, sample_size: int,
                sampling: str = "fixed") -> dp_accounting.DpEvent:
  """One round: `sample_size` of `population` clients sampled, then a release of each noise
  multiplier in `noise_multipliers`, all from the sampled clients."""
  return sampled_round([dp_accounting.GaussianDpEvent(float(s)) for s in noise_multipliers],
                       population, sample_size, sampling)


def accountant(sampling: str = "fixed") -> rdp_lib.RdpAccountant:
  return rdp_lib.RdpAccountant(neighboring_relation=_relation(sampling))


def epsilon(event: dp_accounting.DpEvent, delta: float, sampling: str = "fixed") -> float:
  """epsilon of `event` at `delta`, by the RDP accountant (inf for a non-private event)."""
  acc = accountant(sampling)
  acc.compose(event)
  return float(acc.get_epsilon(delta))


def run_epsilon(noise_multipliers: Sequence[float], population: int, sample_size: int,
                rounds: int, delta: float, sampling: str = "fixed") -> float:
  """epsilon after `rounds` rounds of `round_event`."""
  return epsilon(dp_accounting.SelfComposedDpEvent(
      round_event(noise_multipliers, population, sample_size, sampling), rounds), delta, sampling)


@functools.lru_cache(maxsize=256)  # A config is validated (and this asked) more than once.
def calibrate(target_epsilon: float, releases: int, population: int, sample_size: int,
              rounds: int, delta: float, sampling: str = "fixed") -> float:
  """The smallest noise multiplier sigma (the same for each of a round's `releases`) whose run of
  `rounds` rounds has epsilon <= `target_epsilon` at `delta` (to 1e-4 in sigma)."""
  if not target_epsilon > 0:
    raise ValueError(f"target epsilon must be > 0; got {target_epsilon}")
  # An explicit bracket: the default search starts at sigma = 0, where the accountant divides by 0.
  low, high = 1e-3, 1e3
  if run_epsilon([high] * releases, population, sample_size, rounds, delta, sampling) > \
      target_epsilon:
    raise ValueError(f"epsilon {target_epsilon} at delta {delta:.3g} needs a noise multiplier above "
                     f"{high} for {rounds} rounds of {sample_size} of {population} clients; raise "
                     f"the target or sample fewer clients or rounds")
  return float(dp_accounting.calibrate_dp_mechanism(
      lambda: accountant(sampling),
      lambda s: dp_accounting.SelfComposedDpEvent(
          round_event([s] * releases, population, sample_size, sampling), rounds),
      target_epsilon, delta, dp_accounting.ExplicitBracketInterval(low, high), tol=1e-4))


class Ledger:
  """The run's privacy ledger: the rounds' events composed, epsilon at `delta` after each.

  Identical round events (a run's rounds usually are) are analysed once: RDP composes additively,
  so the ledger keeps the sum of the rounds' RDP vectors over the accountant's orders and converts
  it to epsilon with the accountant's own conversion (`rdp_privacy_accountant.compute_epsilon`).
  """

  def __init__(self, delta: float, sampling: str = "fixed"):
    self.delta, self.sampling = delta, sampling
    self._orders = accountant(sampling).orders
    self._rdp = np.zeros_like(self._orders, dtype=float)
    self._cache: dict[str, np.ndarray] = {}  # repr(event) -> its RDP (events hold lists).
    self._events: dict[str, dp_accounting.DpEvent] = {}
    self.rounds = collections.Counter()  # repr(event) -> rounds.

  def _rdp_of(self, event) -> np.ndarray:
    key = repr(event)
    if key not in self._cache:
      acc = accountant(self.sampling)
      acc.compose(event)
      self._cache[key], self._events[key] = np.asarray(acc.rdp, float), event
    return self._cache[key]

  def add(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
    self._rdp = self._rdp + count * self._rdp_of(event)
    self.rounds[repr(event)] += count

  def epsilon(self) -> float:
    if not self.rounds:
      return 0.0
    if not np.all(np.isfinite(self._rdp)):  # A non-private release (noise 0).
      return math.inf
    eps, _ = rdp_lib.compute_epsilon(self._orders, self._rdp, self.delta)
    return float(eps)

  def event(self) -> dp_accounting.DpEvent:
    """Everything composed so far, as one event (what a direct computation composes)."""
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(self._events[k], n) for k, n in self.rounds.items()])
