"""The contract every registered method and client add-on keeps, one test each (the registries decide
the list: a method added to `tff_ssl.methods`, or an add-on to `tff_ssl.methods.addons`, without an
entry in `CONTRACT` or `ADDON_CONTRACT` fails `test_every_method_and_addon_has_a_contract`).

A federated method builds from bin/train's flags, runs two rounds on synthetic images, and a run
killed after its round-1 checkpoint (the round-2 checkpoint and results.json gone, the CSVs, client
states and TensorBoard events of round 2 left behind) resumes to the same metrics.csv,
aggregation.csv and results, byte for byte, and the same stored client states, array for array; the
rows it kept (round 1's resources.csv line) show it resumed rather than restarted.
Centralized pretraining and the supervised baseline do not resume (one checkpoint, at the end); their
contract is two steps, and the same seed giving the same metrics.csv (centralized) and results.
"""

import json
import os
import shutil

import numpy as np
import pytest

from tests.bin import binaries
from tff_ssl import methods
from tff_ssl.methods import addons
from tff_ssl.federated import client_state

FEDERATED = ["--task=synthetic_dcco_smoke", "--eval_steps=5", "--checkpoint_every=1"]
STEPS = ["--task=synthetic_smoke", "--eval_steps=5", "--steps=2", "--batch_size=16"]
CLIENTS = ["--num_clients=16", "--samples_per_client=4", "--clients_per_round=4",
           "--projector=32,16", "--client_learning_rate=0.05"]
VIT = ["--ssl=mocov3", "--encoder=vit_mini", "--patch_size=7", "--depth=1", "--width=0.5",
       "--predictor=32,16", "--temperature=0.2", "--server_optimizer=sgd",
       "--server_learning_rate=1.0", "--server_lr_schedule=constant"]

# Each method's flags for a two-round run (FEDERATED's otherwise) or a two-step one (STEPS').
CONTRACT = {
    "dcco": ["--rounds=2"],
    "fedavg": ["--rounds=2", "--ssl=simclr", *CLIENTS],
    "fedbyol": ["--rounds=2", "--ssl=byol", *CLIENTS],
    "fedu": ["--rounds=2", "--ssl=byol", *CLIENTS],
    "fedmoco": ["--rounds=2", "--ssl=moco", "--moco_queue=16", *CLIENTS],
    "fedema": ["--rounds=2", "--ssl=byol", *CLIENTS],
    "fedlama": ["--rounds=2", "--ssl=simclr", *CLIENTS],
    "fedprox": ["--rounds=2", "--ssl=simclr", *CLIENTS],
    "fedmoco_lw": ["--rounds=2", *CLIENTS, *VIT],
    "prog_fedssl": ["--rounds=2", *CLIENTS, *VIT],
    "lw_fedssl": ["--rounds=2", "--auxiliary_fraction=0.05", *CLIENTS, *VIT],
    "fll_dd": ["--rounds=2", *CLIENTS, *VIT],
    "heterogeneous": ["--rounds=2", "--ssl=byol", "--architectures=resnet8,vgg9", "--width=0.25",
                      *CLIENTS],
    "centralized": ["--ssl=simclr"],
    "supervised": [],
}


# Each add-on (`tff_ssl.methods.addons`) on a method that takes it, the same contract: FedFoA on
# FedBYOL; FedX and FedU² (FUR and EUA) on FedSimCLR, as their authors' code runs them (FedX's gained predictor; a
# stateful client's start apart from the global model: tests/methods/test_fedx.py).
ADDON_CONTRACT = {
    # FedFoA's bank on FedBYOL (its stage wraps the stateful clients'), from round 0, a client's
    # batch at least the projection's 16 dimensions.
    "fedfoa": ["--method=fedbyol", "--rounds=2", "--ssl=byol", "--fedfoa", "--fedfoa_warmup=0",
               *CLIENTS, "--samples_per_client=16"],
    "fedx": ["--method=fedavg", "--rounds=2", "--ssl=simclr", "--fedx", *CLIENTS],
    "fedu2": ["--method=fedavg", "--rounds=2", "--ssl=simclr", "--fedu2_fur", "--fedu2_eua",
              *CLIENTS],
}

# The methods whose clients keep state between rounds (in the run folder's client-state store).
KEEPS_CLIENT_STATE = {"fedbyol", "fedu", "fedmoco", "fedema", "fedlama", "heterogeneous"}


def package_methods() -> list[str]:
  # Methods a test registers at run time (docs/adding_a_method.md's examples) are built outside the
  # package.
  return [m.name for m in methods.METHODS.values()
          if m.build is None or m.build.__module__.startswith("tff_ssl.")]


def test_every_method_and_addon_has_a_contract():
  assert sorted(CONTRACT) == sorted(package_methods())
  assert sorted(ADDON_CONTRACT) == sorted(a.__name__.rsplit(".", 1)[-1] for a in addons.ADDONS)


def run(out, name):
  if name in ADDON_CONTRACT:
    flags = [*FEDERATED, *ADDON_CONTRACT[name]]
  else:
    flags = [*(FEDERATED if methods.METHODS[name].federated else STEPS), f"--method={name}",
             *CONTRACT[name]]
  ended = binaries.train_in_process(f"--output_dir={out}", *flags)
  assert ended.returncode == 0, ended.stderr[-3000:]
  return ended


def host(name) -> str:
  """The method a contract runs: its own, or an add-on's host (its --method)."""
  flags = ADDON_CONTRACT.get(name, [])
  return next((f.split("=", 1)[1] for f in flags if f.startswith("--method=")), name)


def results_of(run_dir) -> dict:
  results = json.loads((run_dir / "results.json").read_text())
  return {k: v for k, v in results.items() if "seconds" not in k}


@pytest.mark.parametrize("name", [n for n in CONTRACT
                                  if methods.METHODS[n].federated] + list(ADDON_CONTRACT))
def test_two_rounds_then_kill_and_resume_gives_the_same_metrics(tmp_path, name):
  full = tmp_path / "full"
  run(full, name)
  metrics = (full / "metrics.csv").read_text()
  assert len(metrics.splitlines()) == 3, metrics  # The header and two rounds.
  resources = (full / "resources.csv").read_text().splitlines()
  keeps = host(name) in KEEPS_CLIENT_STATE
  assert ("client_states_mb" in resources[0]) == keeps
  assert (full / "client_states").is_dir() == keeps and (not keeps or os.listdir(
      full / "client_states"))
  assert os.listdir(full / "tensorboard")

  killed = tmp_path / "killed"
  shutil.copytree(full, killed)
  shutil.rmtree(killed / "checkpoints" / "program_state_2")
  os.remove(killed / "results.json")
  run(killed, name)
  assert (killed / "metrics.csv").read_text() == metrics
  assert results_of(killed) == results_of(full)
  if (full / "aggregation.csv").exists():
    assert (killed / "aggregation.csv").read_text() == (full / "aggregation.csv").read_text()
  if keeps:  # Every client's stored state after round 2, array for array.
    stores = [client_state.DiskClientStateStore(str(d / "client_states")) for d in (full, killed)]
    assert sorted(stores[0].clients()) == sorted(stores[1].clients())
    for cid in stores[0].clients():
      for x, y in zip(stores[0].read_flat(cid, 2), stores[1].read_flat(cid, 2), strict=True):
        assert np.array_equal(x, y), cid
  resumed = (killed / "resources.csv").read_text().splitlines()
  assert resumed[:2] == resources[:2] and resumed[2] != resources[2]  # Round 1 kept, 2 rerun.


@pytest.mark.parametrize("name", [n for n in CONTRACT
                                  if not methods.METHODS[n].federated])
def test_two_steps_and_the_same_seed_gives_the_same_metrics(tmp_path, name):
  first, second = tmp_path / "first", tmp_path / "second"
  run(first, name)
  run(second, name)
  if methods.METHODS[name].kind == "centralized":  # The supervised baseline writes results only.
    assert (first / "metrics.csv").read_text() == (second / "metrics.csv").read_text()
  assert results_of(first) == results_of(second)
