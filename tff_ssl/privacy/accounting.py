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

Two accountants (`--dp_accountant`), both dp_accounting's:

    rdp   Renyi DP (`RdpAccountant`), converted to (epsilon, delta) by dp_accounting's conversion;
          either sampling above.
    pld   privacy loss distributions (`PLDAccountant`'s mechanism, a pessimistic discretization of
          `PLD_INTERVAL` in the privacy loss: an upper bound, tight to the grid); Poisson sampling
          under add/remove only, the convention DP-SGD's and ViP's results report. dp_accounting's
          PLD has no sampling without replacement.

A round's releases are computed from one sample of clients, so under Poisson sampling they are one
subsampled Gaussian of noise multiplier 1 / sqrt(sum_i 1 / sigma_i^2) (the mean shift of a client's
releases, whitened, has that length): `reduced` says so to the PLD accountant, which (unlike the RDP
one) composes only a single Gaussian under a sampling.

A run's convention is (accountant, sampling, neighbouring relation) (`Convention`); the relation
follows from the sampling (`RELATION_OF`), and any other pairing is refused (`check_convention`:
dp_accounting cannot state its epsilon).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Sequence

import dp_accounting
import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

SAMPLINGS = ("fixed", "poisson")
ACCOUNTANTS = ("rdp", "pld")
RELATIONS = ("replace_one", "add_remove")
# Each sampling's neighbouring relation: fixed-size sampling keeps the population size public.
RELATION_OF = {"fixed": "replace_one", "poisson": "add_remove"}
_RELATIONS = {"replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
              "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE}
# The PLD's discretization of the privacy loss (pessimistic: epsilon is rounded up). Against 1e-4:
# +0.6% at epsilon 0.8 after 4,000 rounds, +0.001% at epsilon 8 after 200; 10x faster (7 ms a round).
PLD_INTERVAL = 1e-3
_NAMES = {"rdp": "RDP", "pld": "PLD", "fixed": "fixed-size sampling", "poisson": "Poisson sampling",
          "replace_one": "replace-one", "add_remove": "add/remove"}


@dataclasses.dataclass(frozen=True)
class Convention:
  """How a run's epsilon is stated: the accountant, the clients' sampling and the neighbouring
  relation (datasets that differ by one client replaced, or by one client added or removed)."""

  accountant: str = "rdp"
  sampling: str = "fixed"
  relation: str = "replace_one"

  @property
  def label(self) -> str:
    """E.g. "PLD, Poisson sampling, add/remove": what a page or a progress bar prints beside
    epsilon."""
    return ", ".join(_NAMES[x] for x in (self.accountant, self.sampling, self.relation))

  @property
  def key(self) -> str:
    """E.g. "pld/poisson/add_remove": what results.json and metrics.csv carry."""
    return "/".join((self.accountant, self.sampling, self.relation))


def convention(accountant: str = "rdp", sampling: str = "fixed", relation: str = "auto"
               ) -> Convention:
  """The `Convention` of these settings (relation "auto": the sampling's own), or a one-line
  ValueError where dp_accounting cannot state its epsilon (`check_convention`)."""
  if sampling not in SAMPLINGS:
    raise ValueError(f"unknown client sampling {sampling!r}; choose one of {list(SAMPLINGS)}")
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"unknown DP accountant {accountant!r}; choose one of {list(ACCOUNTANTS)}")
  if relation == "auto":
    relation = RELATION_OF[sampling]
  if relation not in RELATIONS:
    raise ValueError(f"unknown neighbouring relation {relation!r}; choose auto or one of "
                     f"{list(RELATIONS)}")
  conv = Convention(accountant, sampling, relation)
  check_convention(conv)
  return conv


def check_convention(conv: Convention) -> None:
  """A one-line ValueError where dp_accounting's accountant cannot compose this convention's
  rounds (asked of the accountant itself, on a round of two releases)."""
  event = sampled_round([dp_accounting.GaussianDpEvent(1.0)] * 2, 100, 10, conv.sampling)
  if make_accountant(conv).supports(reduced(event)):
    return
  if conv.relation != RELATION_OF[conv.sampling]:
    fix = (f"--dp_relation={RELATION_OF[conv.sampling]} (or auto), or --client_sampling="
           f"{'poisson' if conv.relation == 'add_remove' else 'fixed'}")
  else:  # PLD with fixed-size sampling.
    fix = "--client_sampling=poisson (add/remove), or --dp_accountant=rdp"
  raise ValueError(f"--dp_accountant={conv.accountant} cannot state epsilon for "
                   f"{_NAMES[conv.sampling]} under {_NAMES[conv.relation]} neighbours "
                   f"(dp_accounting has no such analysis); use {fix}")


def make_accountant(conv: Convention) -> dp_accounting.PrivacyAccountant:
  if conv.accountant == "pld":
    return dp_accounting.pld.PLDAccountant(_RELATIONS[conv.relation],
                                           value_discretization_interval=PLD_INTERVAL)
  return rdp_lib.RdpAccountant(neighboring_relation=_RELATIONS[conv.relation])


def _conv(sampling: str, accountant: str) -> Convention:
  return convention(accountant, sampling)


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
  if sampling not in SAMPLINGS:
    raise ValueError(f"unknown client sampling {sampling!r}; choose one of {list(SAMPLINGS)}")
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


def reduced(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """`event` with each sampled composition of Gaussians (a round's releases, from one sample of
  clients) as the one Gaussian it equals (`noise_multiplier`): the form the PLD accountant
  composes. The RDP accountant makes the same reduction itself."""
  if isinstance(event, (dp_accounting.PoissonSampledDpEvent,
                        dp_accounting.SampledWithoutReplacementDpEvent)):
    sigma = noise_multiplier(event.event)
    if math.isnan(sigma) or isinstance(event.event, dp_accounting.GaussianDpEvent):
      return event
    inner = (dp_accounting.GaussianDpEvent(sigma) if sigma > 0
             else dp_accounting.NonPrivateDpEvent())
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
      return dp_accounting.PoissonSampledDpEvent(event.sampling_probability, inner)
    return dp_accounting.SampledWithoutReplacementDpEvent(event.source_dataset_size,
                                                          event.sample_size, inner)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return dp_accounting.ComposedDpEvent([reduced(e) for e in event.events])
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return dp_accounting.SelfComposedDpEvent(reduced(event.event), event.count)
  return event


def accountant(sampling: str = "fixed", kind: str = "rdp") -> dp_accounting.PrivacyAccountant:
  """A fresh accountant of `kind` under `sampling`'s neighbouring relation."""
  return make_accountant(_conv(sampling, kind))


def epsilon(event: dp_accounting.DpEvent, delta: float, sampling: str = "fixed",
            kind: str = "rdp") -> float:
  """epsilon of `event` at `delta`, by the `kind` accountant (inf for a non-private event)."""
  acc = accountant(sampling, kind)
  acc.compose(reduced(event))
  return float(acc.get_epsilon(delta))


def run_epsilon(noise_multipliers: Sequence[float], population: int, sample_size: int,
                rounds: int, delta: float, sampling: str = "fixed", kind: str = "rdp") -> float:
  """epsilon after `rounds` rounds of `round_event`."""
  return epsilon(dp_accounting.SelfComposedDpEvent(
      round_event(noise_multipliers, population, sample_size, sampling), rounds), delta, sampling,
      kind)


@functools.lru_cache(maxsize=256)  # A config is validated (and this asked) more than once.
def calibrate(target_epsilon: float, releases: int, population: int, sample_size: int,
              rounds: int, delta: float, sampling: str = "fixed", kind: str = "rdp") -> float:
  """The smallest noise multiplier sigma (the same for each of a round's `releases`) whose run of
  `rounds` rounds has epsilon <= `target_epsilon` at `delta` (to 1e-4 in sigma) by the `kind`
  accountant."""
  if not target_epsilon > 0:
    raise ValueError(f"target epsilon must be > 0; got {target_epsilon}")
  # An explicit bracket: the default search starts at sigma = 0, where the accountant divides by 0.
  low, high = 1e-3, 1e3
  if run_epsilon([high] * releases, population, sample_size, rounds, delta, sampling, kind) > \
      target_epsilon:
    raise ValueError(f"epsilon {target_epsilon} at delta {delta:.3g} needs a noise multiplier above "
                     f"{high} for {rounds} rounds of {sample_size} of {population} clients; raise "
                     f"the target or sample fewer clients or rounds")
  if kind == "pld":  # The PLD of a small sigma has a wide support: search from a bracket by RDP,
    # whose epsilon is never below the PLD's (an upper bound on the same loss).
    high = calibrate(target_epsilon, releases, population, sample_size, rounds, delta, sampling,
                     "rdp")
    low = 0.8 * high
    while run_epsilon([low] * releases, population, sample_size, rounds, delta, sampling,
                      kind) <= target_epsilon:
      high, low = low, 0.8 * low
  return float(dp_accounting.calibrate_dp_mechanism(
      lambda: accountant(sampling, kind),
      lambda s: reduced(dp_accounting.SelfComposedDpEvent(
          round_event([s] * releases, population, sample_size, sampling), rounds)),
      target_epsilon, delta, dp_accounting.ExplicitBracketInterval(low, high), tol=1e-4))


def _pld_of(event: dp_accounting.DpEvent):
  """The privacy loss distribution of a (`reduced`) round event, as `PLDAccountant` builds it."""
  if isinstance(event, dp_accounting.PoissonSampledDpEvent) and isinstance(
      event.event, dp_accounting.GaussianDpEvent):
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=event.event.noise_multiplier, sampling_prob=event.sampling_probability,
        value_discretization_interval=PLD_INTERVAL)
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return pld_lib.from_gaussian_mechanism(standard_deviation=event.noise_multiplier,
                                           value_discretization_interval=PLD_INTERVAL)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    out = pld_lib.identity(value_discretization_interval=PLD_INTERVAL)
    for e in event.events:
      out = out.compose(_pld_of(e))
    return out
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return _pld_of(event.event).self_compose(event.count)
  raise ValueError(f"the PLD ledger cannot compose {event!r}")


class Ledger:
  """The run's privacy ledger: the rounds' events composed, epsilon at `delta` after each.

  RDP (`kind` "rdp"): identical round events (a run's rounds usually are) are analysed once: RDP
  composes additively, so the ledger keeps the sum of the rounds' RDP vectors over the accountant's
  orders and converts it to epsilon with the accountant's own conversion
  (`rdp_privacy_accountant.compute_epsilon`).
  PLD ("pld"): the ledger keeps the composed privacy loss distribution and composes each new
  round's into it (one convolution a round, ~7 ms at 200-4,000 rounds; what `PLDAccountant` gives
  for the whole composition, to 1e-9 relative).
  """

  def __init__(self, delta: float, sampling: str = "fixed", kind: str = "rdp"):
    self.delta, self.sampling, self.kind = delta, sampling, kind
    self.convention = _conv(sampling, kind)
    self._orders = accountant(sampling).orders
    self._rdp = np.zeros_like(self._orders, dtype=float)
    self._pld = pld_lib.identity(value_discretization_interval=PLD_INTERVAL)
    self._non_private = False
    self._cache: dict[str, object] = {}  # repr(event) -> its RDP or PLD (events hold lists).
    self._events: dict[str, dp_accounting.DpEvent] = {}
    self.rounds = collections.Counter()  # repr(event) -> rounds.

  def _of(self, event):
    key = repr(event)
    if key not in self._cache:
      if self.kind == "pld":
        self._cache[key] = None if _non_private(event) else _pld_of(reduced(event))
      else:
        acc = accountant(self.sampling)
        acc.compose(event)
        self._cache[key] = np.asarray(acc.rdp, float)
      self._events[key] = event
    return self._cache[key]

  def add(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
    if self.kind == "pld":
      one = self._of(event)
      if one is None:
        self._non_private = True
      elif count:
        self._pld = self._pld.compose(one if count == 1 else one.self_compose(count))
    else:
      self._rdp = self._rdp + count * self._of(event)
    self.rounds[repr(event)] += count

  def epsilon(self) -> float:
    if not self.rounds:
      return 0.0
    if self.kind == "pld":
      return math.inf if self._non_private else float(self._pld.get_epsilon_for_delta(self.delta))
    if not np.all(np.isfinite(self._rdp)):  # A non-private release (noise 0).
      return math.inf
    eps, _ = rdp_lib.compute_epsilon(self._orders, self._rdp, self.delta)
    return float(eps)

  def event(self) -> dp_accounting.DpEvent:
    """Everything composed so far, as one event (what a direct computation composes)."""
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(self._events[k], n) for k, n in self.rounds.items()])
