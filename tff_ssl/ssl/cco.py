"""CCO (DCCO, eq. 1): sum_i (1 - C_ii)^2 + lambda/(d-1) sum_{i!=j} C_ij^2.

CCO is the Barlow Twins loss with its off-diagonal weight written as lambda / (d - 1):
Barlow Twins' lambda_BT is `cco_lambda / (d - 1)` (lambda_BT = 5e-3 at d = 128 is cco_lambda = 0.635).
"""

from __future__ import annotations

from tff_ssl import losses
from tff_ssl.losses import per_client
from tff_ssl.ssl.base import SSLMethod

METHOD = SSLMethod(
    name="cco",
    loss=lambda o, hp: losses.cco_loss(o.z1, o.z2, lambd=hp.cco_lambda),
    per_client_loss=lambda o, sizes, hp: per_client.cco_loss_per_client(
        o.z1, o.z2, sizes, lambd=hp.cco_lambda),
    hparams=("cco_lambda",),
    # --head_norm=batch: CCO: BN in the projector's hidden layers (as Barlow Twins' projector).
    batch_heads="hidden")
