"""Privacy on the wire: client-level differential privacy with accounting, secure aggregation and
compressed updates, for the methods that average clients' updates (and DCCO's statistics).

    --dp=gaussian_fixed     each client's release clipped to L2 norm C (--dp_clip), the clipped
                            releases summed, Gaussian noise of std sigma * C added to the sum, the
                            sum divided by a public denominator (the clients per round; DCCO: the
                            expected images per round)
    --dp=gaussian_adaptive  the same with C adapted to the clients' median norm (Andrew et al.,
                            2021; TFF's `gaussian_adaptive`), starting from --dp_clip
    --dp_noise_multiplier   sigma; or --dp_target_epsilon, which calibrates sigma up front from the
                            planned rounds and sampling (`accounting.calibrate`)
    --dp_accountant         rdp (default) or pld: dp_accounting's RDP or PLD accountant
    --dp_relation           the neighbouring relation: auto (the sampling's own: replace_one with
                            fixed-size sampling, add_remove with --client_sampling=poisson); any
                            other pairing, and PLD with fixed-size sampling, is refused
    --secure_aggregation    the round's sums through TFF's quantized secure sum
                            (`federated_secure_sum_bitwidth`)
    --compression=quantize8 the updates through TFF's encoded sum (uniform 8-bit quantization)

DP uses uniform weights over clipped updates, as DP-FedAvg does (McMahan et al., 2018): a client's
weight N_k would scale its sensitivity. Built from TFF's `DifferentiallyPrivateFactory` over
tensorflow_privacy queries (`queries.py`: seeded noise, records clipped per real client inside a
grouped slot); epsilon at delta = 1 / population per round by `dp_accounting` (`accounting.py`),
stated with its convention (accountant, sampling, relation) wherever it is printed or written.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow_federated as tff
import tensorflow_privacy as tfp
# gaussian_adaptive's noise split (not exported under tff.aggregators).
from tensorflow_federated.python.aggregators.differential_privacy import \
    adaptive_clip_noise_params

from tff_ssl.config_fields import Field
from tff_ssl.privacy import accounting, queries

DP_MECHANISMS = ("off", "gaussian_fixed", "gaussian_adaptive")
COMPRESSIONS = {"none": None, "quantize8": 8, "quantize4": 4}
# TFF's quantization acts on tensors above this many entries (compression_aggregator's default).
COMPRESSION_THRESHOLD = 20000
# A clip that never binds: TF's global-norm clip returns NaN at an infinite clip, and at 2**100 it
# multiplies by exactly 1.0 (a power of two over itself).
NO_CLIP = 2.0 ** 100

DP = Field("dp", "off", "Client-level differential privacy: off; gaussian_fixed (clip to --dp_clip, "
           "Gaussian noise sigma * clip on the sum, a public denominator); gaussian_adaptive (the "
           "clip adapts to the clients' median update norm, from --dp_clip).",
           choices=DP_MECHANISMS)
DP_NOISE_MULTIPLIER = Field("dp_noise_multiplier", 0.0, "DP: the noise multiplier sigma (noise std "
                            "over the clip) of every release; with --dp_target_epsilon, leave 0.",
                            lower=0)
DP_CLIP = Field("dp_clip", 1.0, "DP: each client's L2 clip of its update (gaussian_adaptive: the "
                "initial clip).", lower=0, note="0: no clipping, only with noise multiplier 0")
DP_TARGET_EPSILON = Field("dp_target_epsilon", 0.0, "DP: choose the noise multiplier so that the "
                          "planned run (rounds, clients per round, population) ends at this epsilon "
                          "at delta = 1 / population.", lower=0, note="0: use --dp_noise_multiplier")
DP_NOISE_COHORT = Field(
    "dp_noise_cohort", 0, "DP: add the noise of a cohort of this many clients a round "
    "(pfl-research's noise_cohort_size): the noise multiplier is calibrated (and epsilon accounted) "
    "for K' clients a round, q = K' / num_clients, and the noise on the sum scaled by "
    "clients_per_round / K', so the averaged update carries the noise a K'-client round would. "
    "The run is labelled 'noise simulated for a cohort of K''; its own epsilon is reported beside.",
    lower=0, note="0: the run's own cohort")
DP_ACCOUNTANT = Field(
    "dp_accountant", "rdp", "DP: the accountant of epsilon (dp_accounting's): rdp (Renyi DP; fixed "
    "or Poisson sampling) or pld (privacy loss distributions, tight to a 1e-3 grid in the loss; "
    "--client_sampling=poisson, add/remove neighbours: the convention DP-SGD results report).",
    choices=accounting.ACCOUNTANTS)
DP_RELATION = Field(
    "dp_relation", "auto", "DP: the neighbouring relation epsilon is stated under: auto (the "
    "sampling's own: replace_one with fixed-size sampling, add_remove with Poisson); another "
    "pairing is refused (dp_accounting has no analysis of it).",
    choices=("auto",) + accounting.RELATIONS)
SECURE_AGGREGATION = Field("secure_aggregation", False, "Sum the round's releases with TFF's "
                           "quantized secure sum (federated_secure_sum_bitwidth); "
                           "--simulation=reference.")
COMPRESSION = Field("compression", "none", "Quantize each client's update with TFF's encoded sum "
                    "(uniform quantization of tensors above 20,000 entries); "
                    "--simulation=reference.", choices=tuple(COMPRESSIONS))
DP_AUGMENTATIONS = Field(
    "dp_augmentations", 1, "DP: augmentation multiplicity (De et al., 2022): each client's "
    "update (and DP-DCCO's statistics) is the mean over this many view pairs of each of its "
    "images, before it is clipped (the sensitivity is the clip's, as with one).", lower=1,
    note="1: one view pair")
FIELDS = (DP, DP_NOISE_MULTIPLIER, DP_CLIP, DP_TARGET_EPSILON, DP_NOISE_COHORT, DP_ACCOUNTANT,
          DP_RELATION, DP_AUGMENTATIONS, SECURE_AGGREGATION, COMPRESSION)
FIELD_NAMES = tuple(f.name for f in FIELDS)


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
  """A run's privacy settings (`FIELDS`). `clip` / `statistics_clip` 0 or inf: no clipping.

  population / clients_per_round / rounds: the planned run (accounting, the public denominator);
  sampling: the runner's client sampling (`federated.sampling`: "fixed" or "poisson");
  accountant / relation: how epsilon is stated (`accounting.convention`: "rdp" or "pld"; the
  neighbouring relation, "auto" the sampling's own);
  noise_cohort: K' > 0, the noise of a K'-client round (`DP_NOISE_COHORT`; 0: the run's own);
  releases: Gaussian releases per round (FedAvg-style 1, DCCO 2); seed: the noise's.
  """

  dp: str = "off"
  noise_multiplier: float = 0.0
  clip: float = 1.0
  statistics_clip: float = 1.0
  statistics_quantile: float = 0.5
  statistics_clip_rate: float = 0.2
  target_epsilon: float = 0.0
  secure_aggregation: bool = False
  compression: str = "none"
  population: int = 1
  clients_per_round: int = 1
  rounds: int = 1
  sampling: str = "fixed"
  noise_cohort: int = 0
  releases: int = 1
  seed: int = 0
  accountant: str = "rdp"
  relation: str = "auto"

  def __post_init__(self):
    DP.check(self.dp)
    DP_ACCOUNTANT.check(self.accountant)
    DP_RELATION.check(self.relation)
    DP_NOISE_COHORT.check(self.noise_cohort)
    COMPRESSION.check(self.compression)
    for field, value in ((DP_NOISE_MULTIPLIER, self.noise_multiplier),
                         (DP_TARGET_EPSILON, self.target_epsilon)):
      field.check(value)
    if not 0 < self.statistics_quantile < 1:
      raise ValueError(f"--dp_statistics_quantile must lie in (0, 1) (the fraction of clients "
                       f"left unclipped); got {self.statistics_quantile}")
    if not self.statistics_clip_rate >= 0:
      raise ValueError(f"--dp_statistics_clip_rate must be >= 0 (0: a fixed statistics clip); "
                       f"got {self.statistics_clip_rate}")
    for name, value in (("dp_clip", self.clip), ("dp_statistics_clip", self.statistics_clip)):
      if not value >= 0:
        raise ValueError(f"--{name} must be >= 0 (0: no clipping); got {value}")
    if self.dp == "off":
      set_ = [f"--{n}" for n, v, d in (("dp_noise_multiplier", self.noise_multiplier, 0.0),
                                       ("dp_target_epsilon", self.target_epsilon, 0.0),
                                       ("dp_noise_cohort", self.noise_cohort, 0),
                                       ("dp_accountant", self.accountant, "rdp"),
                                       ("dp_relation", self.relation, "auto"))
              if v != d]
      if set_:
        raise ValueError(f"{set_[0]} is read only with --dp; set --dp=gaussian_fixed (or "
                         f"gaussian_adaptive) or remove it")
      return
    accounting.convention(self.accountant, self.sampling, self.relation)  # Refuses the unstated.
    if self.noise_multiplier and self.target_epsilon:
      raise ValueError(f"--dp_noise_multiplier={self.noise_multiplier} and --dp_target_epsilon="
                       f"{self.target_epsilon} both set the noise; give one")
    if (self.noise_multiplier or self.target_epsilon) and (
        self.unclipped or self.statistics_unclipped and self.releases > 1):
      which = "--dp_clip" if self.unclipped else "--dp_statistics_clip"
      raise ValueError(f"noise without clipping ({which}=0) bounds nothing; set {which} > 0")
    if self.dp == "gaussian_adaptive" and self.unclipped:
      raise ValueError("gaussian_adaptive adapts the clip from --dp_clip; give it an initial "
                       "clip > 0")
    if not 1 <= self.clients_per_round <= self.population:
      raise ValueError(f"DP samples {self.clients_per_round} clients a round from a population of "
                       f"{self.population}; choose clients_per_round <= num_clients")
    if self.noise_cohort:
      if not self.clients_per_round <= self.noise_cohort <= self.population:
        raise ValueError(f"--dp_noise_cohort={self.noise_cohort} must lie between the run's cohort "
                         f"(clients_per_round={self.clients_per_round}) and the population "
                         f"(num_clients={self.population}): a smaller cohort's noise would be "
                         f"larger, a larger one cannot be sampled; choose "
                         f"{self.clients_per_round} <= K' <= {self.population}")

  @property
  def enabled(self) -> bool:
    return self.dp != "off"

  @property
  def adaptive(self) -> bool:
    return self.dp == "gaussian_adaptive"

  def release_adaptive(self, statistics: bool = False) -> bool:
    """Whether a release's clip adapts: every release's under gaussian_adaptive, except a release
    of statistics at --dp_statistics_clip_rate=0 (its clip fixed at --dp_statistics_clip, noised
    with the whole sigma, beside the update's adaptive clip)."""
    return self.adaptive and not (statistics and self.statistics_clip_rate == 0)

  @property
  def unclipped(self) -> bool:
    return self.clip == 0 or math.isinf(self.clip)

  @property
  def statistics_unclipped(self) -> bool:
    return self.statistics_clip == 0 or math.isinf(self.statistics_clip)

  @property
  def any(self) -> bool:
    """Whether anything on the wire differs from a plain sum."""
    return self.enabled or self.secure_aggregation or self.compression != "none"

  @property
  def convention(self) -> accounting.Convention:
    """How this run's epsilon is stated (accountant, sampling, neighbouring relation)."""
    return accounting.convention(self.accountant, self.sampling, self.relation)

  @property
  def delta(self) -> float:
    return accounting.default_delta(self.population)

  @property
  def accounted_cohort(self) -> int:
    """The clients a round the accounting samples: K' with a simulated noise cohort, else K."""
    return self.noise_cohort or self.clients_per_round

  @property
  def noise_scale(self) -> float:
    """The factor on every release's noise std (sigma * clip): K / K' with a simulated noise
    cohort (the noise of the averaged release is then a K'-client round's), else 1."""
    return self.clients_per_round / self.noise_cohort if self.noise_cohort else 1.0

  @property
  def label(self) -> str | None:
    """How results of a simulated noise cohort are marked (None: the run's own noise)."""
    return f"noise simulated for a cohort of {self.noise_cohort}" if self.noise_cohort else None

  @property
  def sigma(self) -> float:
    """The noise multiplier of every release: given, or calibrated to the target epsilon (for the
    accounted cohort and the run's sampling)."""
    if not self.enabled:
      return 0.0
    if self.target_epsilon:
      return accounting.calibrate(self.target_epsilon, self.releases, self.population,
                                  self.accounted_cohort, self.rounds, self.delta, self.sampling,
                                  self.accountant)
    return self.noise_multiplier

  def round_event(self, sigma: float | None = None):
    """One round's DP event as accounted (`accounting.round_event`; a simulated noise cohort:
    K' clients sampled, noise multiplier sigma)."""
    sigma = self.sigma if sigma is None else sigma
    return accounting.round_event([sigma] * self.releases, self.population,
                                  self.accounted_cohort, self.sampling)

  def clip_value(self, statistics: bool = False) -> float:
    unclipped = self.statistics_unclipped if statistics else self.unclipped
    return NO_CLIP if unclipped else float(self.statistics_clip if statistics else self.clip)

  def query(self, sigma: float, denominator: float, release: int = 0, *, statistics=False,
            presummed: bool = False, value_specs=None,
            records: float | None = None) -> queries.SeededQuery:
    """The tfp query of release `release` (its noise seeded by (seed, release)): clipped sum, noise
    sigma * clip (times `noise_scale`), divided by `denominator`; TFF's gaussian_adaptive query
    where adaptive, its clipped count over `records` (the expected clients a round; None: the
    denominator, which it is unless a client's value is a sum over its N_k images, as DCCO's)."""
    records = float(denominator if records is None else records)
    clip = self.clip_value(statistics)
    if self.release_adaptive(statistics):
      # TFF's split of the total sigma between the values and the clipped count.
      # A simulated noise cohort: the K'-client round's split (its count over K' / K as many
      # records), both noises scaled by K / K' as the fixed clip's is.
      scale = self.noise_scale
      try:
        value_sigma, count_std = adaptive_clip_noise_params(float(sigma), records / scale)
      except ValueError:
        raise ValueError(f"gaussian_adaptive at noise multiplier {sigma:.3g} needs more than "
                         f"{math.ceil(10 * sigma)} clients a round (its clipped count's noise is "
                         f"0.05 x clients); got {records / scale:g}: sample more, or use "
                         f"gaussian_fixed") from None
      inner = tfp.NormalizedQuery(tfp.QuantileAdaptiveClipSumQuery(
          initial_l2_norm_clip=clip, noise_multiplier=value_sigma * scale,
          target_unclipped_quantile=self.statistics_quantile if statistics else 0.5,
          learning_rate=self.statistics_clip_rate if statistics else 0.2,
          clipped_count_stddev=count_std * scale, expected_num_records=records,
          geometric_update=True), denominator=denominator)
    else:
      inner = tfp.NormalizedQuery(tfp.GaussianSumQuery(
          l2_norm_clip=clip, stddev=clip * sigma * self.noise_scale), denominator=float(denominator))
    return queries.SeededQuery(inner, [self.seed * 1000 + release, 0], presummed=presummed,
                               value_specs=value_specs)

  def record_sum_factory(self, bound: float) -> tff.aggregators.UnweightedAggregationFactory:
    """How records are summed: TFF's secure sum (values clipped to [-bound, bound], quantized to 32
    bits), TFF's encoded (quantized) sum, or the plain sum."""
    if self.secure_aggregation:
      return tff.aggregators.SecureSumFactory(float(bound))
    bits = COMPRESSIONS[self.compression]
    if bits:
      return tff.aggregators.EncodedSumFactory.quantize_above_threshold(
          quantization_bits=bits, threshold=COMPRESSION_THRESHOLD)
    return tff.aggregators.SumFactory()


def from_config(config, releases: int = 1, statistics_clip: float = 1.0,
                statistics_quantile: float = 0.5, statistics_clip_rate: float = 0.2
                ) -> PrivacyConfig:
  """The `PrivacyConfig` of an `ExperimentConfig` (its fields, its planned run); `statistics_clip`
  / `statistics_quantile` / `statistics_clip_rate`: the clip of a release of encoding statistics,
  its adaptive target unclipped quantile and learning rate (DP-DCCO's `--dp_statistics_clip`,
  `--dp_statistics_quantile`, `--dp_statistics_clip_rate`)."""
  return PrivacyConfig(
      dp=config.dp, noise_multiplier=config.dp_noise_multiplier, clip=config.dp_clip,
      statistics_clip=statistics_clip, statistics_quantile=statistics_quantile,
      statistics_clip_rate=statistics_clip_rate,
      target_epsilon=config.dp_target_epsilon,
      secure_aggregation=config.secure_aggregation, compression=config.compression,
      population=config.num_clients, clients_per_round=config.clients_per_round,
      rounds=config.rounds, sampling=getattr(config, "client_sampling", "fixed"),
      noise_cohort=getattr(config, "dp_noise_cohort", 0), releases=releases, seed=config.seed,
      accountant=getattr(config, "dp_accountant", "rdp"),
      relation=getattr(config, "dp_relation", "auto"))


def view_pairs(config, private: PrivacyConfig) -> int:
  """The view pairs a client's DP release averages over (`--dp_augmentations`); ValueError where
  they are asked for without DP."""
  m = getattr(config, "dp_augmentations", 1)
  if m > 1 and not private.enabled:
    raise ValueError(f"--dp_augmentations={m} averages each client's DP release over view pairs; "
                     f"this run has no DP (set --dp, or drop it)")
  return m


def conventions(configs) -> str:
  """How the epsilons of these configs' runs are stated (a table's heading): their distinct
  conventions' labels, e.g. "RDP, fixed-size sampling, replace-one"."""
  labels = []
  for c in configs:
    label = accounting.convention(getattr(c, "dp_accountant", "rdp"),
                                  getattr(c, "client_sampling", "fixed"),
                                  getattr(c, "dp_relation", "auto")).label
    if label not in labels:
      labels.append(label)
  return "; ".join(labels)


def check_noise_stated(config, fields_set) -> None:
  """A DP run states its noise: --dp_target_epsilon > 0, --dp_noise_multiplier > 0, or an explicit
  --dp_noise_multiplier=0 (`fields_set`: the fields given on the command line), the clip-only
  diagnostic. Otherwise a run asked for DP and would get none (epsilon = inf)."""
  if (getattr(config, "dp", "off") == "off" or config.dp_target_epsilon or
      config.dp_noise_multiplier or "dp_noise_multiplier" in fields_set):
    return
  raise ValueError(f"--dp={config.dp} without --dp_target_epsilon or --dp_noise_multiplier adds no "
                   f"noise, so the run would not be private (epsilon = inf): set "
                   f"--dp_target_epsilon > 0 or --dp_noise_multiplier > 0 (an explicit "
                   f"--dp_noise_multiplier=0 runs the clip-only diagnostic)")


def notice(config) -> str | None:
  """The line a DP run prints as it starts where its epsilon is not its own guarantee: without
  noise (the clip-only diagnostic) or with a simulated noise cohort; None for any other run."""
  if getattr(config, "dp", "off") == "off":
    return None
  if not (config.dp_target_epsilon or config.dp_noise_multiplier):
    return (f"--dp={config.dp} at --dp_noise_multiplier=0: clipping without noise, a diagnostic; "
            f"the run is not private (epsilon = inf)")
  if config.dp_noise_cohort:
    return (f"--dp_noise_cohort={config.dp_noise_cohort}: noise simulated for a cohort of "
            f"{config.dp_noise_cohort} (its epsilon is a {config.dp_noise_cohort}-client round's; "
            f"this run's own, of {config.clients_per_round} clients, is epsilon_actual)")
  return None


def summary_line(results: dict) -> str | None:
  """A DP run's closing line: its epsilon (and its label, with a simulated noise cohort)."""
  if results.get("dp", "off") == "off" or "epsilon" not in results:
    return None
  line = f"epsilon {results['epsilon']:.3f} at delta {results['delta']:.3g}"
  if results.get("dp_convention_label"):
    line += f" ({results['dp_convention_label']})"
  if results.get("dp_label"):
    line += f" ({results['dp_label']}; this run's own: {results['epsilon_actual']:.3f})"
  return line


def check_simulation(privacy: PrivacyConfig, simulation: str) -> None:
  """Secure aggregation and compression act on what each real client sends, which only the
  reference simulation has: a grouped slot would quantize its clients' partial sum (one rounding
  for many clients)."""
  if simulation == "reference":
    return
  if privacy.secure_aggregation:
    raise ValueError("--secure_aggregation quantizes each real client's value before the secure "
                     "sum; grouped slots would quantize a partial sum: add --simulation=reference")
  if privacy.compression != "none":
    raise ValueError(f"--compression={privacy.compression} quantizes each real client's update; "
                     f"grouped slots would quantize a partial sum: add --simulation=reference")
