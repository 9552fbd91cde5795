"""Every combination privacy refuses: one line that says why, exit 2, nothing written.

The reasons are checked where the config is made (ExperimentConfig: what bin/train builds before it
writes anything); three of them end to end through bin/train. The FedAvg process refuses a client
term that uploads reports (fedprox) when it is built, before the run folder exists.
"""

import dataclasses

import pytest

from tff_ssl import cli, privacy
from tff_ssl.experiment import ExperimentConfig
from tests.bin.binaries import train_in_process

FEDAVG = dict(method="fedavg", ssl="simclr", dataset="synthetic", samples_per_client=4,
              num_clients=50, clients_per_round=8)
DP = dict(dp="gaussian_fixed", dp_noise_multiplier=1.0)

REFUSED = [
    ("loss weighting", dict(FEDAVG, aggregator="loss", **DP), "softmax(-L_k)"),
    ("L-DAWA", dict(FEDAVG, aggregator="ldawa", **DP), "cosine to the global model"),
    ("L-DAWA_Loss", dict(FEDAVG, aggregator="ldawa_loss", **DP), "softmax(-L_k)"),
    ("M-DAWA", dict(FEDAVG, aggregator="mdawa", **DP), "per-client factor"),
    ("divergence measurement", dict(FEDAVG, measure_divergence=True, **DP), "without noise"),
    ("FedAvg on unequal clients", dict(FEDAVG, partition="dirichlet_split", alpha=0.5, **DP),
     "unequal size"),
    ("FedLAMA", dict(FEDAVG, method="fedlama", **DP), "un-noised per-layer divergences"),
    ("heterogeneous clients", dict(FEDAVG, method="heterogeneous", **DP), "different shapes"),
    ("layer-wise family", dict(FEDAVG, method="fedmoco_lw", ssl="mocov3", encoder="vit_mini",
                               patch_size=4, depth=2, server_optimizer="sgd",
                               server_lr_schedule="constant", **DP), "restarts its stage's"),
    ("DP-DCCO on unequal clients", dict(method="dcco", dataset="synthetic",
                                        partition="dirichlet_split", alpha=0.5, **DP),
     "unequal size"),
    ("secure sums in grouped slots", dict(FEDAVG, secure_aggregation=True), "partial sum"),
    ("compression in grouped slots", dict(method="dcco", dataset="synthetic",
                                          compression="quantize8"), "partial sum"),
    ("secure sums with the Loss mean", dict(FEDAVG, aggregator="loss", simulation="reference",
                                            secure_aggregation=True), "softmax(-L_k)"),
    ("noise without DP", dict(FEDAVG, dp_noise_multiplier=1.0), "only with --dp"),
    ("noise twice", dict(FEDAVG, dp_target_epsilon=3.0, **DP), "give one"),
    ("noise without a clip", dict(FEDAVG, dp_clip=0.0, **DP), "bounds nothing"),
    ("PLD with fixed-size sampling", dict(FEDAVG, dp_accountant="pld", **DP),
     "--client_sampling=poisson"),
    ("add/remove with fixed-size sampling", dict(FEDAVG, dp_relation="add_remove", **DP),
     "fixed-size sampling under add/remove"),
    ("replace-one with Poisson sampling", dict(FEDAVG, clients_per_round=25,
                                                client_sampling="poisson",
                                                dp_relation="replace_one", **DP),
     "Poisson sampling under replace-one"),
    ("an accountant without DP", dict(FEDAVG, dp_accountant="pld"), "only with --dp"),
]


@pytest.mark.parametrize("what,fields,reason", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_with_its_reason(what, fields, reason):
  del what
  with pytest.raises(ValueError) as e:
    ExperimentConfig(**fields)
  assert reason in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("flags", [
    ["--method=fedavg", "--ssl=simclr", "--samples_per_client=4", "--aggregator=ldawa",
     "--dp=gaussian_fixed", "--dp_noise_multiplier=1"],
    ["--method=fedprox", "--ssl=simclr", "--samples_per_client=4", "--dp=gaussian_fixed",
     "--dp_noise_multiplier=1"],
    ["--secure_aggregation"],
    ["--dp=gaussian_fixed", "--dp_noise_multiplier=1", "--dp_accountant=pld"],
    ["--method=fedprox", "--ssl=simclr", "--samples_per_client=4", "--simulation=reference",
     "--secure_aggregation"],
])
def test_bin_train_refuses_in_one_line_and_writes_nothing(tmp_path, flags):
  out = tmp_path / "run"
  ended = train_in_process("--task=synthetic_dcco_smoke", *flags, f"--output_dir={out}")
  assert ended.returncode == cli.EXIT_ERROR, ended.stderr[-2000:]
  assert ended.stderr.strip().count("\n") == 0 and "Traceback" not in ended.stderr
  assert ("refuses" in ended.stderr or "partial sum" in ended.stderr or
          "cannot state epsilon" in ended.stderr)
  assert not out.exists()


def test_a_dp_run_without_noise_is_refused_unless_the_zero_is_explicit():
  """--dp with neither --dp_target_epsilon nor --dp_noise_multiplier would run with no noise and
  write epsilon = inf: refused. An explicit --dp_noise_multiplier=0 is the clip-only diagnostic,
  which runs and says so."""
  config = ExperimentConfig(method="dcco", dataset="synthetic", dp="gaussian_fixed")
  with pytest.raises(ValueError, match=r"would not be private \(epsilon = inf\)") as e:
    config.check_fields_for_method({"dp", "dp_target_epsilon", "dp_clip"})
  assert "\n" not in str(e.value)
  config.check_fields_for_method({"dp", "dp_noise_multiplier"})  # Explicit: allowed.
  assert "not private" in privacy.notice(config)
  assert privacy.notice(dataclasses.replace(config, dp_noise_multiplier=1.0)) is None
  assert privacy.notice(ExperimentConfig(method="dcco", dataset="synthetic")) is None


def test_bin_train_refuses_dp_without_noise_and_writes_nothing(tmp_path):
  out = tmp_path / "run"
  ended = train_in_process("--task=synthetic_dcco_smoke", "--dp=gaussian_fixed",
                           "--dp_target_epsilon=0", "--dp_clip=1", f"--output_dir={out}")
  assert ended.returncode == cli.EXIT_ERROR, ended.stderr[-2000:]
  assert ended.stderr.strip().count("\n") == 0 and "not be private" in ended.stderr
  assert not out.exists()
