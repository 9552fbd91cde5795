"""FedMoCo (the generalized framework of Zhuang et al., ICLR 2022, with MoCo v1/v2): every round a
client's online network (encoder, projector) is replaced by the global one; its momentum network and
its queue of negative keys stay on the client across rounds (`tff_ssl.methods.fedssl`). Our sources
do not say whether the paper's clients keep their queue between rounds; we keep it, as the momentum
network it was filled by is kept. v1 / v2: `--projector` (one linear layer / an MLP) and
`--temperature` (0.07 / 0.2)."""

from tff_ssl.methods import fedssl

METHOD = fedssl.method(
    "fedmoco", lambda config: fedssl.StatefulConfig(),
    "FedMoCo: global online network each round, the client's own momentum network and queue kept.",
    ssl=("moco",))
