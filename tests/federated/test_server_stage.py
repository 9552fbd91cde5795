"""Server stages fold into a host by one function: the provider's client state first, then the
wrapper, whatever the order; stages whose order could matter, or that do what they do not declare,
are refused in one line."""

import pytest

from tff_ssl.federated import server_stage
from tff_ssl.federated.server_stage import ServerStage


class Plain(ServerStage):
  def __init__(self, key, changes=False):
    self.key, self.changes_update = key, changes


class Toy(ServerStage):
  """A stage that provides or wraps the clients' state (a tuple of keys)."""

  def __init__(self, key, role="wraps"):
    self.key, self.client_state_role = key, role

  def client_state(self, inner, model):
    if self.client_state_role == "provides":
      assert inner is None, "a provider takes no state"
      return (self.key,)
    assert inner is not None, "a wrapper needs a state"
    return inner + (self.key,)


class Chooser(Toy):
  """A Toy that also chooses the aggregation (a tuple of keys); `declared`: whether it says so."""

  def __init__(self, key, role="provides", declared=True):
    super().__init__(key, role)
    self.chooses_aggregation = declared

  def aggregation(self, factory):
    return (factory or ()) + (self.key,)


class Config:
  terms = ()

  def with_terms(self, *terms):
    out = Config()
    out.terms = self.terms + terms
    return out


def test_the_provider_comes_first_whatever_the_order():
  base, wrap, other = Chooser("own"), Toy("bank"), Plain("plain")
  for order in ((base, wrap, other), (wrap, other, base), (other, wrap, base)):
    state, _, factory = server_stage.fold(order, None, None, Config(), None)
    assert state == ("own", "bank") and factory == ("own",)


@pytest.mark.parametrize("stages,what", [
    ((Toy("a", "provides"), Toy("b", "provides")), "provide the clients' state"),
    ((Toy("a"), Toy("b")), "wrap the clients' state"),
    ((Plain("a", changes=True), Plain("b", changes=True)), "change the round's update"),
    ((Chooser("a"), Chooser("b", "wraps")), "choose the aggregation"),
])
def test_two_stages_whose_order_could_matter_are_refused(stages, what):
  with pytest.raises(ValueError, match=f"^server stages 'a' and 'b' both {what}, so their order "
                     "would change the round; use one of them$"):
    server_stage.fold(stages, None, None, Config(), None)


def test_a_stage_declares_what_it_does_a_known_role_and_a_key_of_its_own():
  with pytest.raises(ValueError, match="client_state_role must be one of"):
    server_stage.check((Toy("a", "replaces"),))
  with pytest.raises(ValueError, match="'a' makes the clients' state: declare its client_state_role"):
    server_stage.check((Toy("a", ""),))
  with pytest.raises(ValueError, match="'a' chooses the aggregation: declare chooses_aggregation"):
    server_stage.check((Plain("b"), Chooser("a", declared=False)))
  with pytest.raises(ValueError, match="distinct, non-empty keys"):
    server_stage.check((Plain("a"), Plain("a")))
  server_stage.check((Chooser("a"), Toy("b"), Plain("c", changes=True)))
