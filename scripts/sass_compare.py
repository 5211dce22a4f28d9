#!/usr/bin/env python3
"""Compare the machine code of two Loom JIT caches kernel by kernel: does a refactor of device code change any SASS?

Fill two caches with the same compiles from the two builds (the CPU compile tests compile every kernel family):

    LOOM_CACHE_DIR=/tmp/sass-a build-a/tests/loom_unit_tests --gtest_filter='*Compile*:*NoSpills*'
    LOOM_CACHE_DIR=/tmp/sass-b build-b/tests/loom_unit_tests --gtest_filter='*Compile*:*NoSpills*'
    scripts/sass_compare.py /tmp/sass-a /tmp/sass-b [--nvdisasm PATH]

Entries are matched by (kernel, header, target, defines). Kernels whose code sections differ byte for byte are
disassembled (nvdisasm) and compared again with what a moved line or string shifts masked: constant-bank 4 offsets
(the addresses of globals and string literals), local labels and the immediates of moves into call-return registers.
Exit status 1 when any kernel still differs or is in one cache only.
"""
import argparse
import hashlib
import json
import pathlib
import re
import shutil
import struct
import subprocess
import sys


def code_sections(cubin: pathlib.Path) -> dict:
    """Digest of each .text section of an ELF64 cubin."""
    b = cubin.read_bytes()
    if b[:4] != b"\x7fELF" or b[4] != 2:
        raise ValueError(f"{cubin}: not an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in sections:
        n = b[names_at + name:b.index(b"\0", names_at + name)].decode()
        if n.startswith(".text"):
            out[n] = hashlib.sha256(b[off:off + size]).hexdigest()
    return out


def load(root: str) -> dict:
    entries = {}
    for meta in pathlib.Path(root, "jit").glob("*/meta.json"):
        j = json.loads(meta.read_text())
        cubin = meta.parent / "kernel.cubin"
        if not cubin.exists() or j.get("kernel", "").startswith("<header"):
            continue
        key = (j["kernel"], j.get("header"), j.get("target"), tuple(j.get("defines", [])))
        entries[key] = cubin
    return entries


def normalised(nvdisasm: str, cubin: pathlib.Path) -> list:
    text = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    lines = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;", line)
        if not m:
            continue
        s = re.sub(r"c\[0x4\]\[0x[0-9a-f]+\]", "c[0x4][*]", m.group(1))
        s = re.sub(r"`?\(?\.L_x_\d+\)?", "L", s)
        s = re.sub(r"^(MOV R\d+), 0x[0-9a-f]+$", r"\1, *", s)
        lines.append(s)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cache_a")
    ap.add_argument("cache_b")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "/usr/local/cuda/bin/nvdisasm")
    args = ap.parse_args()
    a, b = load(args.cache_a), load(args.cache_b)
    identical, masked, differ = 0, 0, []
    for key in sorted(set(a) & set(b)):
        if code_sections(a[key]) == code_sections(b[key]):
            identical += 1
        elif normalised(args.nvdisasm, a[key]) == normalised(args.nvdisasm, b[key]):
            masked += 1
        else:
            differ.append(key)
    only = sorted(set(a) ^ set(b))
    for key in differ:
        print("differs:", key)
    for key in only:
        print("only in", "A" if key in a else "B", key)
    print(f"{identical} kernels identical, {masked} identical but for addresses of globals and code, "
          f"{len(differ)} differ, {len(only)} in one cache only")
    return 1 if differ or only else 0


if __name__ == "__main__":
    sys.exit(main())
