"""Server stages fold into a host by one function: the providers' client state first, then the
wrappers, whatever the order; two stages whose order would matter are refused in one line."""

import pytest

from tff_ssl.federated import server_stage
from tff_ssl.federated.server_stage import ServerStage


class Toy(ServerStage):
  def __init__(self, key, role="", changes=False, chooses=False):
    self.key, self.client_state_role = key, role
    self.changes_update, self.chooses_aggregation = changes, chooses

  def client_state(self, inner, model):
    if self.client_state_role == "provides":
      assert inner is None, "a provider takes no state"
      return (self.key,)
    if self.client_state_role == "wraps":
      assert inner is not None, "a wrapper needs a state"
      return inner + (self.key,)
    return inner

  def aggregation(self, factory):
    return (factory or ()) + (self.key,) if self.chooses_aggregation else factory


class Config:
  terms = ()

  def with_terms(self, *terms):
    out = Config()
    out.terms = self.terms + terms
    return out


def test_the_provider_comes_first_whatever_the_order():
  base, wrap, other = Toy("own", "provides"), Toy("bank", "wraps"), Toy("plain")
  for order in ((base, wrap, other), (wrap, other, base), (other, wrap, base)):
    state, _, factory = server_stage.fold(order, None, None, Config(), None)
    assert state == ("own", "bank") and factory is None


@pytest.mark.parametrize("stages,what", [
    ((Toy("a", "provides"), Toy("b", "provides")), "provide the clients' state"),
    ((Toy("a", changes=True), Toy("b", changes=True)), "change the round's update"),
    ((Toy("a", chooses=True), Toy("b", chooses=True)), "choose the aggregation"),
])
def test_two_stages_whose_order_would_matter_are_refused(stages, what):
  with pytest.raises(ValueError, match=f"^server stages 'a' and 'b' both {what}, so their order "
                     "would change the round; use one of them$"):
    server_stage.fold(stages, None, None, Config(), None)


def test_a_stage_declares_a_known_role_and_a_key_of_its_own():
  with pytest.raises(ValueError, match="client_state_role must be one of"):
    server_stage.check((Toy("a", "replaces"),))
  with pytest.raises(ValueError, match="distinct, non-empty keys"):
    server_stage.check((Toy("a"), Toy("a")))
  server_stage.check((Toy("a", "provides", changes=True, chooses=True), Toy("b", "wraps")))
