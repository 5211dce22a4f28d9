"""Where the ranks are: nodes x GPUs per node, or several ranks sharing one GPU."""


class Topology:
    """nodes x gpus_per_node ranks, one per GPU; or (shared=True) `ranks` ranks on one GPU under MPS."""

    def __init__(self, nodes=1, gpus_per_node=8, shared_ranks=0):
        if shared_ranks:
            if nodes != 1:
                raise ValueError(f"topology: ranks sharing a GPU need nodes=1, got nodes={nodes}")
            if shared_ranks < 2:
                raise ValueError(f"topology: shared_ranks: expected >= 2, got {shared_ranks}")
            gpus_per_node = shared_ranks
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError(f"topology: expected nodes >= 1 and gpus_per_node >= 1, got {nodes}, {gpus_per_node}")
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.shared = bool(shared_ranks)

    @property
    def ranks(self):
        return self.nodes * self.gpus_per_node

    def __repr__(self):
        if self.shared:
            return f"{self.ranks} ranks sharing one GPU"
        return f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.gpus_per_node} GPUs"
