"""Config fields that describe themselves (`tff_ssl.config_fields`): one declaration gives the field,
its check and its bin/train flag; a method declares its own; hparams.json carries the layout's
version, and an older one still reads."""

import ast
import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest
from absl import flags

from tff_ssl import cli, config_fields, experiment, methods, rundir, runner
from tff_ssl.config_fields import Field
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.method import Method
from tff_ssl.methods import fedavg, fedprox

from tests.bin.binaries import TRAIN


@pytest.mark.parametrize("field,domain", [
    (Field("a", 1, "", lower=1), ">= 1"),
    (Field("a", 1.0, "", lower=0, open_lower=True), "> 0"),
    (Field("a", 0.5, "", lower=0, upper=1, open_lower=True), "in (0, 1]"),
    (Field("a", 0.5, "", lower=0, upper=1, open_upper=True), "in [0, 1)"),
    (Field("a", 0.5, "", upper=2.5), "<= 2.5"),
    (Field("a", "x", "", choices=("x", "y")), ""),
])
def test_a_field_states_its_domain(field, domain):
  assert field.domain() == domain


@pytest.mark.parametrize("field,value,message", [
    (Field("steps", 1, "", lower=1), 0, "steps must be >= 1; got 0"),
    (Field("mu", 0.1, "", lower=0, note="0: FedAvg"), -0.5, "mu must be >= 0 (0: FedAvg); got -0.5"),
    (Field("p", 0.5, "", lower=0, upper=1, open_upper=True), 1.0, r"p must be in [0, 1); got 1.0"),
    (Field("lr", 0.1, "", lower=0, open_lower=True), float("inf"),
     "--lr=inf is not a finite number; give a finite value (its default: 0.1)"),
    (Field("mode", "x", "", choices=("x", "y")), "z", "unknown mode 'z'; choose one of ['x', 'y']"),
    (Field("sizes", (4,), "", item=int, lower=1), (4, 0), "sizes must be >= 1; got 0"),
    (Field("dir", None, "", kind=str), None, "dir needs a value (its default: None)"),
])
def test_a_value_outside_the_domain_is_one_line_naming_it(field, value, message):
  with pytest.raises(ValueError) as e:
    field.check(value)
  assert str(e.value) == message


def test_the_config_checks_each_field_by_its_declaration():
  with pytest.raises(ValueError, match=r"^fedprox_mu must be >= 0 \(0: FedAvg\); got -1.0$"):
    ExperimentConfig(method="fedprox", ssl="simclr", samples_per_client=4, fedprox_mu=-1.0)
  with pytest.raises(ValueError, match=r"^unknown aggregator 'median'; choose one of \["):
    ExperimentConfig(method="fedavg", ssl="simclr", samples_per_client=4, aggregator="median")
  # A list from JSON is a tuple in the config.
  assert ExperimentConfig(projector=[8, 4]).projector == (8, 4)


def test_every_field_is_declared_once_and_every_method_field_reaches_the_config():
  specs = config_fields.specs(ExperimentConfig)
  assert [s.name for s in specs] == [f.name for f in dataclasses.fields(ExperimentConfig)]
  for method in methods.METHODS.values():
    for spec in method.declared:
      assert config_fields.spec_of(ExperimentConfig.__dataclass_fields__[spec.name]) is spec
  with pytest.raises(ValueError, match="'fedprox_mu' is declared twice, differently"):
    config_fields.collect([[fedprox.MU], [Field("fedprox_mu", 1.0, "another")]])


def test_a_method_field_is_one_declaration_in_its_module_and_a_flag():
  """Adding a field to a method: one `Field` in its module, listed in its `fields`. The config
  assembled with the method has it, and the generated flags show its help and domain."""
  weight = Field("toy_weight", 0.5, "Toy: the weight of its term.", lower=0, upper=1)
  toy = Method(name="toy_field", kind="federated", fields=fedavg.FIELDS + (weight,),
               ssl=fedavg.METHOD.ssl, validate=fedavg.process_config, build=fedavg.build,
               summary="A method with a field of its own.")
  config_class = experiment.config_class([*methods.METHODS.values(), toy])
  assert config_class().toy_weight == 0.5
  flag_values = flags.FlagValues()
  cli.define_config_flags(config_class, flag_values)
  assert flag_values["toy_weight"].help == ("Toy: the weight of its term. Must be in [0, 1]. "
                                            "(config default: 0.5)")
  flag_values(["prog", "--toy_weight=2"])
  with pytest.raises(ValueError, match=r"^toy_weight must be in \[0, 1\]; got 2.0$"):
    config_class(**cli.config_overrides(config_class, flag_values))
  # Registered at run time, after the config was assembled, it is refused in one line.
  with pytest.raises(ValueError, match=r"declares config fields \['toy_weight'\] that "
                                       r"ExperimentConfig .* lacks; add its line to METHODS"):
    methods.register(toy)


def test_bin_train_helpfull_shows_every_field_from_its_declaration():
  shown = subprocess.run([sys.executable, TRAIN, "--helpfull"], capture_output=True, text=True,
                         timeout=300, check=False).stdout  # absl exits 1 after help.
  flat = " ".join(shown.split())
  for spec in config_fields.specs(ExperimentConfig):
    assert f"--{spec.name}:" in shown or f"--[no]{spec.name}:" in shown, spec.name
  assert ("--fedprox_mu: FedProx: the weight mu of the clients' proximal term (mu / 2) "
          "||w - w_global||^2. Must be >= 0 (0: FedAvg). (config default: 0.01)") in flat
  # Written nowhere by hand: bin/train defines no config flag of its own.
  source = open(TRAIN).read()
  assert "DEFINE_float(\"fedprox_mu\"" not in source and source.count("flags.DEFINE_") == 4


def test_hparams_carry_the_layout_version_and_an_older_layout_still_reads(tmp_path):
  config = ExperimentConfig(method="centralized", optimizer="sgdm", steps=3)
  text = rundir.hparams_json(config)
  assert json.loads(text)[config_fields.VERSION_KEY] == config_fields.VERSION == 2
  (tmp_path / "hparams.json").write_text(text)
  assert rundir.same_settings(str(tmp_path / "hparams.json"), config)
  # Version 1 (no key): its centralized "sgd" had momentum 0.9, today's "sgdm".
  old = json.loads(text)
  del old[config_fields.VERSION_KEY]
  old["optimizer"] = "sgd"
  (tmp_path / "hparams.json").write_text(json.dumps(old))
  assert rundir.same_settings(str(tmp_path / "hparams.json"), config)
  assert experiment.load_config(str(tmp_path)) == config
  # A newer layout is refused in one line naming both versions.
  newer = json.loads(text)
  newer[config_fields.VERSION_KEY] = 3
  (tmp_path / "hparams.json").write_text(json.dumps(newer))
  with pytest.raises(ValueError, match=r"hparams.json has config_version 3, newer than this "
                                       r"tff-ssl's 2; update tff-ssl"):
    experiment.load_config(str(tmp_path))



def test_a_config_is_parsed_once_and_build_reads_what_validate_returned():
  # Behavior: FedAvg's build takes the ClientConfig made when the config was (a field changed behind
  # the config's back afterwards does not reach it).
  config = ExperimentConfig(method="fedavg", ssl="simclr", dataset="synthetic", encoder="resnet8",
                            width=0.25, projector=(16, 8), client_learning_rate=0.05)
  assert config.parsed[0].client_learning_rate == 0.05
  object.__setattr__(config, "client_learning_rate", 9.0)  # Not through the config's checks.
  model = FunctionalModel(runner.ssl_model_builder(config, (12, 12, 1)))
  assert runner.build_process(config, model, (12, 12, 1)).config.client_learning_rate == 0.05
  # The add-ons' stages too: FedFoA's settings are those of the config as it was made.
  foa = ExperimentConfig(method="fedbyol", ssl="byol", dataset="synthetic", encoder="resnet8",
                         width=0.25, projector=(16, 8), fedfoa=True, fedfoa_lambda=0.5)
  object.__setattr__(foa, "fedfoa_lambda", 9.0)
  stages = foa.parsed[3].of(None, None)
  assert [s.config.weight for s in stages] == [0.5]
  # Structure: no method's build (or process constructor) calls a parser of the config
  # (`process_config`, a `validate`, a typed config's maker); each reads `config.parsed`.
  parsers = {"process_config", "validate", "_validate", "lama_config", "stateful_of",
             "feature_correlation_config", "pretrain_config", "stages"}
  for path in pathlib.Path(methods.__file__).parent.glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.FunctionDef) and node.name in ("build", "__init__"):
        called = {getattr(c.func, "attr", getattr(c.func, "id", "")) for c in ast.walk(node)
                  if isinstance(c, ast.Call)}
        assert not called & parsers, (path.name, node.lineno, called & parsers)
