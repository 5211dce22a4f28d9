"""Writing kernels from Python: Loom's runtime compiler for a user's own kernel (examples/04_jit_user_kernel).

    k = loom.jit.compile(source_or_header, "user::scale_by_rank", ["4"])
    k.launch(grid, block, world.ctx(), loom.jit.f32(0.5), x, y, loom.jit.i32(n))

The kernel is a __global__ function (or template) in a header (a path) or in source text (kept in the cache
directory, named by its hash); it may include Loom's headers ("loom/lang/lang.cuh": symm_at, notify, wait, ...),
which the JIT supplies. NVRTC compiles it for the current GPU (or `arch`) and the result is cached on disk.

Arguments, one per kernel parameter, in order: a torch tensor passes its data pointer (a T* parameter); world.ctx()
a loom::Ctx; typed scalars i32 / u32 / i64 / u64 / f32 / f64 / ptr; a plain Python int passes as int (i32) and a
float as float (f32). The launch goes on the current torch stream unless `stream` is given.
"""
import hashlib
import os
import struct

from . import _C


class Arg:
    """One kernel argument as the bytes of the C++ parameter."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = bytes(data)

    def __repr__(self):
        return f"loom.jit.Arg({len(self.data)} bytes)"


def _packer(fmt):
    return lambda v: Arg(struct.pack(fmt, v))


i32, u32, i64, u64, f32, f64 = (_packer(f) for f in ("<i", "<I", "<q", "<Q", "<f", "<d"))
ptr = _packer("<Q")


def _arg(v) -> bytes:
    if isinstance(v, Arg):
        return v.data
    if isinstance(v, bool):
        raise TypeError("kernel argument: a bool is ambiguous; pass loom.jit.i32(int(v)) or a typed scalar")
    if isinstance(v, int):
        return struct.pack("<i", v)
    if isinstance(v, float):
        return struct.pack("<f", v)
    if hasattr(v, "data_ptr"):
        if not getattr(v, "is_cuda", True):
            raise ValueError(f"kernel argument: expected a CUDA tensor, given one on {v.device}")
        return struct.pack("<Q", v.data_ptr())
    raise TypeError(f"kernel argument: expected a tensor, loom.jit scalar, int, float or world.ctx(); given "
                    f"{type(v).__name__}")


def _source_header(source: str) -> str:
    """The header to #include for `source`: the path itself, or source text written once under the cache."""
    if "\n" not in source and os.path.isfile(source):
        return os.path.abspath(source)
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    root = os.environ.get("LOOM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "loom")
    folder = os.path.join(root, "python-src")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{digest}.cuh")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: ranks may write the same file at once
    return path


class Kernel:
    """A compiled kernel. `info` is its compile record (compiler, registers, spills, cache hit, seconds)."""

    def __init__(self, header, name, template_args, defines, include_dirs, arch):
        self.header, self.name = header, name
        self.template_args = [str(a) for a in template_args]
        self.defines, self.include_dirs = list(defines), list(include_dirs)
        self._k = None
        if arch is None and _C.gpu_available():
            self._k = _C.jit_get_kernel(header, name, self.template_args, self.defines, self.include_dirs)
            self.info = self._k.info
        else:
            self.info = _C.jit_compile(header, name, self.template_args, self.defines, self.include_dirs,
                                       90 if arch is None else int(arch))

    def launch(self, grid, block, *args, smem: int = 0, stream=None, cluster=(1, 1, 1), cooperative=False):
        """Launches on `stream` (default: torch's current stream) with grid / block as ints or up to 3-tuples."""
        if self._k is None:
            raise RuntimeError(f"{self.name}: compiled for an explicit arch without a GPU; nothing to launch on "
                               f"({_C.gpu_unavailable_reason()})")
        if stream is None:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
        stream = int(getattr(stream, "cuda_stream", stream))
        self._k.launch(_dim3(grid), _dim3(block), smem, stream, [_arg(a) for a in args], _dim3(cluster), cooperative)

    def __getitem__(self, launch):
        """k[grid, block](*args) or k[grid, block, smem](*args)."""
        return lambda *args, **kw: self.launch(*launch[:2], *args, smem=launch[2] if len(launch) > 2 else 0, **kw)

    def __repr__(self):
        targs = f"<{', '.join(self.template_args)}>" if self.template_args else ""
        return f"loom.jit.Kernel({self.name}{targs})"


def _dim3(d):
    d = (d,) if isinstance(d, int) else tuple(int(x) for x in d)
    if not 1 <= len(d) <= 3 or any(x < 1 for x in d):
        raise ValueError(f"expected a positive int or 1 to 3 positive ints; given {d}")
    return d + (1,) * (3 - len(d))


def compile(source: str, name: str, template_args=(), *, defines=(), include_dirs=(), arch=None) -> Kernel:
    """Compiles kernel `name` (qualified, e.g. "user::scale_by_rank") with literal `template_args` from `source` (a
    header path or source text). With a GPU and no `arch` the kernel is loaded for the current device; with `arch`
    (compute capability x 10: 90 for sm_90a) it is only compiled (no GPU needed). Raises loom.Error with the
    compiler log on a compile error."""
    return Kernel(_source_header(source), name, template_args, defines, include_dirs, arch)
