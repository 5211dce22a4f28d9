"""Algorithm choices given as strings ("auto", "one_shot", "copy_engine") -> the extension's enums."""
from . import _C


def _table(enum):
    return {m.name.lower(): m for m in enum}


_TABLES = {
    e.__name__: _table(e)
    for e in (_C.CollAlgo, _C.DataPath, _C.ReduceOp, _C.AgProducer, _C.RsAlgo, _C.RsTransport, _C.ArAlgo,
              _C.UlyssesAlgo, _C.TpMoeAlgo, _C.EpMoeAlgo)
}


def parse(enum, value, arg: str):
    """The member of `enum` named by `value` (case and underscores ignored: "one_shot" == "OneShot")."""
    if isinstance(value, enum):
        return value
    table = _TABLES[enum.__name__]
    key = str(value).replace("_", "").replace("-", "").lower()
    if key not in table:
        choices = ", ".join(repr(n) for n in table)
        raise ValueError(f"{arg}: expected one of {choices}; given {value!r}")
    return table[key]
