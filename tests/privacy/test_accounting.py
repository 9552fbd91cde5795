"""Privacy accounting in the field's convention (`--dp_accountant=pld|rdp`, the neighbouring relation),
checked against numbers computed outside the code path.

  * RDP, Poisson sampling, add/remove: TensorFlow Privacy's published DP-SGD epsilons for MNIST
    (tutorials/README.md: 60,000 examples, batches of 256, delta = 1e-5; 1.12 / 60 epochs -> 2.92,
    0.6 / 30 -> 9.74, 1.2 / 10 -> 1.20), from the RDP of our round event converted as that tutorial
    did (epsilon = min over its orders of RDP - log(delta) / (order - 1)).
  * PLD without sampling: a DCCO run of R rounds of two releases of noise sigma, every client each
    round, is one Gaussian mechanism of sensitivity sqrt(2 R) / sigma, whose exact (epsilon, delta)
    curve is Balle & Wang's (2018, Theorem 8): the accountant's epsilon is on it, to its grid.
  * PLD of one Poisson-subsampled DCCO round (two releases from one sample): the hockey-stick
    divergence of the two-dimensional mixture integrated numerically on a grid, both directions
    of add/remove.
  * The run's PLD ledger equals dp_accounting's `PLDAccountant` over the whole composition; PLD is
    never above RDP; calibration meets its target.
  * Conventions dp_accounting cannot state are refused in one line.
"""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import optimize, special, stats

from tff_ssl import privacy
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.privacy import PrivacyConfig, accounting

# TensorFlow Privacy, tutorials/README.md, "Select Parameters" (noise multiplier, epochs, epsilon),
# and its mnist_dpsgd_tutorial.py's accounting: q = 256 / 60,000, epochs * (60,000 // 256) steps,
# delta = 1e-5, orders 1.1 ... 10.9 and 12 ... 63.
TF_PRIVACY_MNIST = [(1.12, 60, 2.92), (0.6, 30, 9.74), (1.2, 10, 1.20)]
TUTORIAL_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))


@pytest.mark.parametrize("sigma,epochs,published", TF_PRIVACY_MNIST)
def test_rdp_gives_tensorflow_privacys_published_epsilons(sigma, epochs, published):
  steps = epochs * (60000 // 256)
  event = accounting.round_event([sigma], 60000, 256, "poisson")
  acc = rdp_lib.RdpAccountant(orders=TUTORIAL_ORDERS,
                              neighboring_relation=accounting.accountant("poisson").neighboring_relation)
  acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
  rdp = np.asarray(acc._rdp)  # pylint: disable=protected-access
  classic = float(np.min(rdp - math.log(1e-5) / (np.asarray(TUTORIAL_ORDERS) - 1)))
  assert abs(classic - published) <= 0.01  # Published to two decimals.
  # Today's conversions are tighter than the tutorial's: RDP's own, then PLD's.
  rdp_eps = accounting.run_epsilon([sigma], 60000, 256, steps, 1e-5, "poisson", "rdp")
  pld_eps = accounting.run_epsilon([sigma], 60000, 256, steps, 1e-5, "poisson", "pld")
  assert pld_eps < rdp_eps < classic


def _gaussian_epsilon(mu: float, delta: float) -> float:
  """Balle & Wang (2018), Theorem 8: a Gaussian mechanism whose mean shift over its noise is mu is
  (epsilon, delta)-DP iff Phi(mu / 2 - epsilon / mu) - e^epsilon Phi(-mu / 2 - epsilon / mu)
  <= delta; the epsilon where it equals delta."""
  ndtr = special.ndtr

  def excess(eps):
    return ndtr(mu / 2 - eps / mu) - math.exp(eps) * ndtr(-mu / 2 - eps / mu) - delta

  return optimize.brentq(excess, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize("sigma,rounds", [(2.0, 10), (5.0, 200)])
def test_pld_without_sampling_is_balle_and_wangs_gaussian(sigma, rounds):
  """Every client each round (q = 1): R rounds of DCCO's two releases are one Gaussian of
  sensitivity sqrt(2 R) / sigma."""
  want = _gaussian_epsilon(math.sqrt(2 * rounds) / sigma, 1e-5)
  got = accounting.run_epsilon([sigma, sigma], 100, 100, rounds, 1e-5, "poisson", "pld")
  ledger = accounting.Ledger(1e-5, "poisson", "pld")
  ledger.add(accounting.round_event([sigma, sigma], 100, 100, "poisson"), count=rounds)
  assert want - 1e-6 <= got <= want + 1e-3  # Pessimistic on a 1e-3 grid in the loss.
  assert ledger.epsilon() == pytest.approx(got, rel=1e-9)


def _mixture_epsilon(q: float, sigma: float, delta: float) -> float:
  """One round of two releases (noise sigma each, clip 1) from a Poisson sample of rate q, under
  add/remove: the hockey-stick divergences between P = (1 - q) N(0, s^2 I) + q N((1, 1), s^2 I)
  (with the client) and Q = N(0, s^2 I) (without), both ways, on a 2-D grid; the epsilon where the
  larger equals delta."""
  x = np.linspace(-12 * sigma, 1 + 12 * sigma, 2401)
  h = x[1] - x[0]
  a, b = np.meshgrid(x, x, indexing="ij")
  q_dens = stats.norm.pdf(a, scale=sigma) * stats.norm.pdf(b, scale=sigma)
  p_dens = (1 - q) * q_dens + q * stats.norm.pdf(a, 1, sigma) * stats.norm.pdf(b, 1, sigma)

  def excess(eps):
    one = np.sum(np.maximum(p_dens - math.exp(eps) * q_dens, 0)) * h * h
    other = np.sum(np.maximum(q_dens - math.exp(eps) * p_dens, 0)) * h * h
    return max(one, other) - delta

  return optimize.brentq(excess, 1e-6, 20.0, xtol=1e-9)


def test_pld_of_a_poisson_sampled_dcco_round_is_the_integrated_mixture():
  q, sigma, delta = 0.2, 0.8, 1e-3
  want = _mixture_epsilon(q, sigma, delta)
  event = accounting.round_event([sigma, sigma], 1000, 200, "poisson")  # Two releases, one sample.
  got = accounting.epsilon(event, delta, "poisson", "pld")
  assert abs(got - want) <= 1e-3  # (RDP: 4.73.)
  # The reduction the PLD accountant needs: the releases as one Gaussian of sigma / sqrt(2).
  assert accounting.reduced(event).event.noise_multiplier == pytest.approx(sigma / math.sqrt(2))


@pytest.mark.parametrize("population,sample_size,sigmas", [
    (60000, 4096, (4.10, 4.10)), (200, 16, (1.3,)), (1000, 40, (0.0, 1.0))])
def test_the_pld_ledger_is_dp_accountings_composition(population, sample_size, sigmas):
  event = accounting.round_event(list(sigmas), population, sample_size, "poisson")
  ledger = accounting.Ledger(1.0 / population, "poisson", "pld")
  for r in range(1, 6):
    ledger.add(event)
    if 0.0 in sigmas:  # A release without noise: no guarantee.
      assert ledger.epsilon() == math.inf
      continue
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=accounting.PLD_INTERVAL)
    sigma = 1.0 / math.sqrt(sum(s ** -2 for s in sigmas))
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        sample_size / population, dp_accounting.GaussianDpEvent(sigma)), r))
    assert ledger.epsilon() == pytest.approx(acc.get_epsilon(1.0 / population), rel=1e-6)
    assert ledger.epsilon() <= accounting.run_epsilon(list(sigmas), population, sample_size, r,
                                                      1.0 / population, "poisson", "rdp")


def test_pld_calibration_meets_its_target_with_less_noise():
  args = (2, 60000, 4096, 200, 1.0 / 60000, "poisson")
  pld, rdp = accounting.calibrate(8.0, *args, "pld"), accounting.calibrate(8.0, *args, "rdp")
  got = accounting.run_epsilon([pld] * 2, 60000, 4096, 200, 1.0 / 60000, "poisson", "pld")
  assert 8.0 - 0.01 <= got <= 8.0 and pld < rdp
  # The table's own convention (fixed-size, replace-one, RDP) needs far more noise.
  assert accounting.calibrate(8.0, 2, 60000, 4096, 200, 1.0 / 60000, "fixed", "rdp") > 2.5 * pld


@pytest.mark.parametrize("accountant,sampling,relation,reason", [
    ("pld", "fixed", "auto", "use --client_sampling=poisson (add/remove), or --dp_accountant=rdp"),
    ("rdp", "fixed", "add_remove", "fixed-size sampling under add/remove"),
    ("pld", "fixed", "add_remove", "fixed-size sampling under add/remove"),
    ("rdp", "poisson", "replace_one", "Poisson sampling under replace-one"),
    ("pld", "poisson", "replace_one", "Poisson sampling under replace-one"),
])
def test_a_convention_without_an_analysis_is_refused(accountant, sampling, relation, reason):
  with pytest.raises(ValueError) as e:
    PrivacyConfig(dp="gaussian_fixed", noise_multiplier=1.0, population=100, clients_per_round=50,
                  sampling=sampling, accountant=accountant, relation=relation)
  assert reason in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("accountant,sampling,label,key", [
    ("rdp", "fixed", "RDP, fixed-size sampling, replace-one", "rdp/fixed/replace_one"),
    ("rdp", "poisson", "RDP, Poisson sampling, add/remove", "rdp/poisson/add_remove"),
    ("pld", "poisson", "PLD, Poisson sampling, add/remove", "pld/poisson/add_remove"),
])
def test_every_stated_convention_is_named(accountant, sampling, label, key):
  config = ExperimentConfig(method="dcco", dataset="synthetic", num_clients=100,
                            clients_per_round=50, dp="gaussian_fixed", dp_noise_multiplier=1.0,
                            client_sampling=sampling, dp_accountant=accountant)
  conv = privacy.from_config(config).convention
  assert (conv.label, conv.key) == (label, key)
