"""The round anatomy every federated method shares (the methods built on it: `tff_ssl.methods`).

    process.py       the one process interface the run layer calls (`FederatedProcess`), the build
                     context, and the common case of one global model
    client_work.py   a client's work in a round: its config, local training, and the client-term
                     plug-in (`ClientTerm`)
    round_parts.py   a round's optional parts: client states, broadcast context, ids, reports
    client_state.py  per-client state between rounds, and its on-disk store
    grouping.py      the grouped simulation: many real clients per TFF client slot, exactly
    server_stage.py  the server's plug-in (`ServerStage`): its state, broadcast and round step
    common.py        client inputs and their types, flat vectors, the round's seed, views
    masks.py         the tensors a process trains and exchanges (`TensorMask`)
    local_steps.py   the clients' optimizer steps (`client_step`, `train`) and their schedule
    server_step.py   the server state, the server optimizer and the server loop (optimizers:
                     `tff_ssl.optim`)
    functional.py    Keras models as pure functions of their weights
    ssl_model.py     the SSL model of a config (encoder + heads)
"""

from tff_ssl.federated.client_work import ClientConfig, ClientTerm
from tff_ssl.federated.common import client_inputs
from tff_ssl.federated.server_step import ServerState
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.process import BuildContext, FederatedProcess
