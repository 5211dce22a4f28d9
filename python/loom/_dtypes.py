"""Element types: torch dtypes <-> Loom's DType (loom/tensor.hpp)."""
from . import _C

DType = _C.DType

_BY_NAME = {
    "float32": DType.F32,
    "float16": DType.F16,
    "bfloat16": DType.BF16,
    "float8_e4m3fn": DType.F8E4M3,
    "int32": DType.I32,
    "int64": DType.I64,
    "uint8": DType.U8,
}


def to_loom(dtype):
    """Loom's DType of a torch dtype (or its name: "bfloat16"); ValueError for a type Loom does not take."""
    name = str(dtype).removeprefix("torch.")
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"Loom takes float32, float16, bfloat16, float8_e4m3fn, int32, int64 and uint8 tensors; given {name}"
        ) from None


def to_torch(dtype):
    """The torch dtype of a Loom DType."""
    import torch

    for name, d in _BY_NAME.items():
        if d == dtype:
            return getattr(torch, name)
    raise ValueError(f"no torch dtype for {dtype}")


def itemsize(dtype) -> int:
    """Bytes per element of a torch dtype Loom takes."""
    return _C.dtype_size(to_loom(dtype))
