"""Federated SSL processes in TFF: DCCO and FedAvg with a within-client SSL loss."""

from tff_ssl.federated.common import SERVER_OPTIMIZERS, ServerState, client_inputs
from tff_ssl.federated.dcco import DCCOConfig, DCCOProcess
from tff_ssl.federated.fedavg import FedAvgSSLConfig, FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
