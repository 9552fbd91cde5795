"""The round anatomy every federated method shares (the methods built on it: `tff_ssl.methods`).

    process.py       the one process interface the run layer calls (`FederatedProcess`), the build
                     context, and the common case of one global model
    client_work.py   a client's work in a round: its config, local training, and the client-term
                     plug-in (`ClientTerm`)
    round_parts.py   a round's optional parts: client states, broadcast context, ids, reports
    client_state.py  per-client state between rounds, and its on-disk store
    grouping.py      the grouped simulation: many real clients per TFF client slot, exactly
    common.py        client inputs and views, the server state, tensor masks, the local step, the
                     server's optimizer step and the server loop (optimizers: `tff_ssl.optim`)
    functional.py    Keras models as pure functions of their weights
    ssl_model.py     the SSL model of a config (encoder + heads)
"""

from tff_ssl.federated.client_work import ClientConfig, ClientTerm
from tff_ssl.federated.common import ServerState, client_inputs
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.process import BuildContext, FederatedProcess
