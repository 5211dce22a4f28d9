"""loom.World: one per process; rank facts, the symmetric heap, and the handle the ops and kernels take.

Symmetric tensors: ``world.empty(shape, dtype)`` is a torch tensor in this rank's symmetric heap (the same offset on
every rank, so ``world.peer(t, r)`` is rank r's copy, mapped into this process). Allocation is collective: every rank
calls ``empty`` in the same order with the same shape and dtype. Freeing is deferred: when the last tensor viewing an
allocation dies, the allocation is queued, and the next ``empty`` (or ``collect``) frees, on every rank together,
what every rank has dropped. Tensors of a World must not be used after ``shutdown`` (their memory is unmapped).
"""
import atexit
import os
import socket
import threading
import weakref

from . import _C
from ._dtypes import itemsize

Error = _C.Error

_registry = {}  # id -> World: how the torch custom ops (which take an int) find their World
_registry_lock = threading.Lock()
_next_id = [1]
_default = [None]


def _register(world) -> int:
    with _registry_lock:
        wid = _next_id[0]
        _next_id[0] += 1
        _registry[wid] = world
    return wid


def lookup(world_id: int) -> "World":
    """The live World registered under `world_id` (the int the custom ops carry)."""
    w = _registry.get(world_id)
    if w is None:
        raise ValueError(f"no live loom.World with id {world_id} (shut down, or from another process)")
    return w


def rank_info(env=None) -> dict:
    """The rank facts Loom reads from `env` (a dict; default: the process's environment), as World.from_env does:
    LOOM_*, else torchrun's, Open MPI's or Slurm's variables. Raises loom.Error naming a malformed variable."""
    return _C.rank_info_from_env(None if env is None else {str(k): str(v) for k, v in env.items()})


class World:
    """A Loom World (see the module's doc). Build it with ``loom.init()``, ``World.from_env()``,
    ``World.create(rank, world_size, ...)`` or ``World.from_process_group(group)``."""

    def __init__(self, handle):
        self._h = handle
        self._allocs = weakref.WeakValueDictionary()  # base pointer -> SymAlloc, for peer()
        self.id = _register(self)
        atexit.register(_shutdown_at_exit, weakref.ref(self))
        if handle.device >= 0:
            try:
                import torch

                torch.cuda.set_device(handle.device)
            except ImportError:
                pass

    # ---- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_env(cls, *, symmetric_size: int = 0, coll_scratch: int = 0, device: int = -1, create_heap: bool = True,
                 bind_device: bool = True) -> "World":
        """From the environment (loomrun, torchrun, mpirun, srun; see ``rank_info``). Collective.
        symmetric_size: bytes of this rank's heap (0: LOOM_SYMMETRIC_SIZE, 1 GiB). coll_scratch: bytes of the
        collectives' symmetric scratch (0: 64 MiB; at least 1 MiB). device: -1 for LOOM_DEVICE, else local rank mod
        the visible GPUs. create_heap=False: the store and rank facts only (no GPU needed)."""
        return cls(_C.World.from_env(symmetric_size, coll_scratch, device, create_heap, bind_device))

    @classmethod
    def create(cls, rank: int, world_size: int, *, local_rank: int = -1, local_world_size: int = -1,
               master_addr: str = "127.0.0.1", master_port: int = 29500, symmetric_size: int = 0,
               coll_scratch: int = 0, device: int = -1, create_heap: bool = True, bind_device: bool = True) -> "World":
        """From explicit rank facts (local_rank / local_world_size default to rank / world_size: one node). Rank 0
        serves the bootstrap store on master_port. Collective."""
        return cls(_C.World.create(rank, world_size, local_rank, local_world_size, master_addr, master_port,
                                   symmetric_size, coll_scratch, device, create_heap, bind_device))

    @classmethod
    def from_process_group(cls, group=None, *, symmetric_size: int = 0, coll_scratch: int = 0,
                           device: int = -1) -> "World":
        """From an initialised torch.distributed process group (default: the world group), one Loom rank per group
        rank. Collective over the group. The group's collectives supply the rank layout (host names give the local
        ranks) and rank 0's address and a free port, on which Loom's own store then runs: no second rendezvous
        variable is needed. device: -1 for torch's current device."""
        import torch
        import torch.distributed as dist

        rank, size = dist.get_rank(group), dist.get_world_size(group)
        hosts = [None] * size
        dist.all_gather_object(hosts, socket.gethostname(), group=group)
        local = [r for r in range(size) if hosts[r] == hosts[rank]]
        if local != list(range(local[0], local[0] + len(local))) or size % len(local):
            raise ValueError(f"from_process_group: Loom needs the group's ranks laid out host by host with the same "
                             f"number per host; given hosts {hosts}")
        addr_port = [None]
        if rank == 0:
            addr = "127.0.0.1" if len(local) == size else os.environ.get("MASTER_ADDR") or socket.gethostbyname(
                socket.gethostname())
            addr_port = [(addr, _free_port())]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(addr_port, src=src, group=group)
        addr, port = addr_port[0]
        if device < 0 and torch.cuda.is_available():
            device = torch.cuda.current_device()
        return cls.create(rank, size, local_rank=local.index(rank), local_world_size=len(local), master_addr=addr,
                          master_port=port, symmetric_size=symmetric_size, coll_scratch=coll_scratch, device=device)

    # ---- facts -------------------------------------------------------------------------------------------------
    rank = property(lambda self: self._h.rank)
    world_size = property(lambda self: self._h.world_size)
    local_rank = property(lambda self: self._h.local_rank)
    local_world_size = property(lambda self: self._h.local_world_size)
    node = property(lambda self: self._h.node)
    device = property(lambda self: self._h.device, doc="CUDA device index of this rank (-1: none bound)")
    heap_size = property(lambda self: self._h.heap_size, doc="bytes of each rank's symmetric heap")
    info = property(lambda self: self._h.info, doc="the rank facts, as a dict")

    @property
    def torch_device(self):
        import torch

        return torch.device("cuda", self.device)

    def __repr__(self):
        if self._h.is_shut_down:
            return "loom.World(shut down)"
        return f"loom.World(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    # ---- symmetric tensors -------------------------------------------------------------------------------------
    def empty(self, shape, dtype=None):
        """A torch tensor of `shape` and `dtype` (default float32) in the symmetric heap, uninitialised. Collective:
        every rank asks for the same shape and dtype in the same order (a mismatch raises loom.Error on every
        rank). Also frees the allocations every rank has dropped."""
        import torch

        dtype = torch.float32 if dtype is None else dtype
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"empty: expected non-negative sizes, given shape {shape}")
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * itemsize(dtype)
        a = self._h.alloc(max(nbytes, 1))
        self._allocs[a.ptr] = a
        raw = torch.from_dlpack(_C.export_bytes(a, a.ptr, max(nbytes, 1), self.device))
        return raw[:nbytes].view(dtype).view(shape)

    def zeros(self, shape, dtype=None):
        """``empty`` then zero-filled on the current stream (peers must not write it before this rank's fill is
        done: meet them with ``barrier`` or a stream barrier first)."""
        return self.empty(shape, dtype).zero_()

    def _owner(self, tensor):
        p = tensor.data_ptr()
        for base, a in list(self._allocs.items()):
            if base <= p < base + a.nbytes:
                return a
        raise ValueError(f"expected a view of a tensor from this World's empty(); given a tensor at {p:#x}, outside "
                         f"its symmetric allocations")

    def is_symmetric(self, tensor) -> bool:
        """Whether every element of `tensor` lies in this rank's symmetric heap."""
        nbytes = tensor.numel() * tensor.element_size()
        return bool(tensor.is_cuda and self._h.is_symmetric(tensor.data_ptr(), max(nbytes, 1)))

    def peer(self, tensor, rank: int):
        """Rank `rank`'s copy of `tensor` (a view of a tensor from ``empty``), mapped into this process: same shape,
        strides and dtype; reads and writes go over NVLink (or to the same GPU's memory when ranks share it). The
        view keeps this rank's allocation alive."""
        import torch

        if rank == self.rank:
            return tensor
        a = self._owner(tensor)
        peer_base = self._h.peer_ptr(a.ptr, rank)
        raw = torch.from_dlpack(_C.export_bytes(a, peer_base, a.nbytes, self.device))
        size = tensor.element_size()
        offset = tensor.data_ptr() - a.ptr
        if offset % size:
            raise ValueError(f"peer: the tensor starts {offset} bytes into its allocation, not a multiple of its "
                             f"element size {size}")
        typed = raw[: a.nbytes - a.nbytes % size].view(tensor.dtype)
        return typed.as_strided(tensor.shape, tensor.stride(), offset // size)

    def collect(self) -> int:
        """Collective: frees the symmetric allocations that every rank has dropped; returns how many."""
        return self._h.collect()

    def pending_frees(self) -> int:
        """Allocations this rank dropped that are not yet freed (waiting for the other ranks or a collect())."""
        return self._h.pending_frees()

    # ---- kernels, synchronisation, teardown --------------------------------------------------------------------
    def ctx(self):
        """The device handle (loom::Ctx) as a kernel argument for loom.jit kernels."""
        from .jit import Arg

        return Arg(self._h.ctx())

    def all_gather_object(self, obj, tag: str = "object"):
        """Collective over the bootstrap store (host side, no GPU): every rank's picklable obj, in rank order."""
        import pickle

        return [pickle.loads(b) for b in self._h.all_gather_bytes(tag, pickle.dumps(obj))]

    def init_torch_distributed(self, backend: str = "nccl"):
        """Initialises torch.distributed's default group with this World's ranks (when it is not initialised yet),
        rendezvousing on a free port that rank 0 picks and shares over Loom's store: a torch.distributed baseline
        runs beside Loom under loomrun, mpirun or srun with no further variable."""
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return dist.group.WORLD
        port = self.all_gather_object(_free_port() if self.rank == 0 else None, "torch-port")[0]
        addr = self.info["master_addr"]
        kwargs = {"device_id": torch.device("cuda", self.device)} if backend == "nccl" else {}
        # A store made here, not a tcp:// init_method: under torchrun (TORCHELASTIC_USE_AGENT_STORE) torch would
        # connect every rank as a client to tcp://addr:port, where no server listens, and wait for its timeout.
        store = dist.TCPStore(addr, port, self.world_size, is_master=self.rank == 0)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size, **kwargs)
        return dist.group.WORLD

    def barrier(self, tag: str = ""):
        """Host barrier over the bootstrap store (collective); see loom.barrier_on_stream for a stream-ordered one."""
        self._h.barrier(tag)

    def release_collective_state(self):
        self._h.release_collective_state()

    def release_overlap_state(self):
        self._h.release_overlap_state()

    def shutdown(self):
        """Collective and idempotent: frees what every rank dropped, synchronises the device, meets the peers, and
        unmaps the heap. Called at interpreter exit for a World still alive."""
        self._h.shutdown()
        with _registry_lock:
            _registry.pop(self.id, None)
        if _default[0] is self:
            _default[0] = None

    @property
    def is_shut_down(self) -> bool:
        return self._h.is_shut_down


def _shutdown_at_exit(ref):
    w = ref()
    if w is not None and not w.is_shut_down:
        w.shutdown()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init(**kwargs) -> World:
    """Creates the process's default World from the environment (World.from_env(**kwargs)), or, when
    torch.distributed is initialised and no Loom rank variable is set, from its default group. Returns it; ops
    called without world= use it."""
    if _default[0] is not None and not _default[0].is_shut_down:
        return _default[0]
    w = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and "LOOM_RANK" not in os.environ:
            w = World.from_process_group(**kwargs)
    except ImportError:
        pass
    if w is None:
        w = World.from_env(**kwargs)
    _default[0] = w
    return w


def default_world() -> World:
    """The World made by loom.init(); RuntimeError when there is none."""
    w = _default[0]
    if w is None or w.is_shut_down:
        raise RuntimeError("no loom World: call loom.init() first, or pass world=")
    return w


def resolve(world) -> World:
    return default_world() if world is None else world
