"""Reads single tensors out of a safetensors checkpoint, each into its own torch allocation.

Why not ``safetensors.safe_open``: with ``framework="pt"`` it maps a whole file into one
storage and hands out views of it, so dropping a tensor frees nothing until every view and the
file handle are gone. A streaming loader must own each tensor's memory to free a layer's FP8
experts after re-quantizing them, so this reader parses the header (the documented format:
8-byte little-endian header length, a JSON header ``{name: {dtype, shape, data_offsets}}``,
then the data) and reads one tensor's bytes into a fresh ``torch.empty``.

A checkpoint is one ``.safetensors`` file or a directory of them (``*.safetensors.index.json``
is not needed: every file's header is read, and a tensor found in two files is an error).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from hwrun.errors import HwrunError

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F8_E4M3": torch.float8_e4m3fn,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I32": torch.int32,
    "I64": torch.int64,
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit


class CheckpointError(HwrunError, ValueError):
    """A checkpoint that cannot be loaded as asked: names the tensor and what was expected."""

    MAX_LISTED = 20  # problems spelled out in one error; the rest are counted

    @classmethod
    def listing(cls, what: str, problems: list[str]) -> CheckpointError:
        """One error for every problem found: the first ``MAX_LISTED`` spelled out."""
        shown = problems[: cls.MAX_LISTED]
        more = len(problems) - len(shown)
        lines = [f"{what} ({len(problems)} problems):", *(f"  - {p}" for p in shown)]
        if more:
            lines.append(f"  ... and {more} more")
        return cls("\n".join(lines))


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: its file, dtype name, shape and byte range in the file."""

    name: str
    path: Path
    dtype: str  # safetensors dtype name, e.g. "F8_E4M3"
    shape: tuple[int, ...]
    start: int  # absolute byte offset of the data in the file
    nbytes: int


class SafetensorsCheckpoint:
    """The tensor table of a checkpoint; :meth:`read` loads one tensor."""

    def __init__(self, path: str | Path):
        root = Path(path)
        if root.is_dir():
            files = sorted(root.glob("*.safetensors"))
        elif root.is_file():
            files = [root]
        else:
            raise CheckpointError(f"checkpoint {str(root)!r} is neither a file nor a directory")
        if not files:
            raise CheckpointError(f"checkpoint directory {str(root)!r} has no *.safetensors file")
        self.entries: dict[str, TensorEntry] = {}
        for file in files:
            for entry in _read_header(file):
                if entry.name in self.entries:
                    raise CheckpointError(
                        f"tensor {entry.name!r} is in both {self.entries[entry.name].path.name} "
                        f"and {file.name}; a checkpoint must hold each tensor once"
                    )
                self.entries[entry.name] = entry

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def read(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        """Tensor ``name`` in its stored dtype and shape, in memory owned by the tensor alone.

        For another ``device`` the bytes pass through one host buffer of this tensor's size,
        freed on return."""
        entry = self.entries.get(name)
        if entry is None:
            raise CheckpointError(f"tensor {name!r} is not in the checkpoint")
        raw = torch.empty(entry.nbytes, dtype=torch.uint8)
        with entry.path.open("rb") as handle:
            handle.seek(entry.start)
            got = handle.readinto(memoryview(raw.numpy()))
        if got != entry.nbytes:
            raise CheckpointError(
                f"tensor {name!r}: {entry.path.name} ends after {got} of its {entry.nbytes} "
                "bytes; the file is truncated"
            )
        return raw.to(device).view(SAFETENSORS_DTYPES[entry.dtype]).view(entry.shape)


def _read_header(path: Path) -> list[TensorEntry]:
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise CheckpointError(f"{path.name}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{path.name}: header length {header_len} does not fit the file")
        try:
            header = json.loads(handle.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(
                f"{path.name}: the safetensors header is not JSON ({err})"
            ) from err
    data_start = 8 + header_len
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info.get("dtype"), tuple(info.get("shape", ()))
        begin, end = info.get("data_offsets", (0, -1))
        if dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"tensor {name!r} in {path.name} has dtype {dtype!r}; this loader reads "
                f"{', '.join(SAFETENSORS_DTYPES)}"
            )
        itemsize = torch.empty((), dtype=SAFETENSORS_DTYPES[dtype]).element_size()
        nbytes = math.prod(shape) * itemsize
        if end - begin != nbytes or begin < 0 or data_start + end > size:
            raise CheckpointError(
                f"tensor {name!r} in {path.name}: {dtype} {list(shape)} needs {nbytes} bytes, "
                f"its data_offsets [{begin}, {end}] do not hold them inside the file"
            )
        entries.append(TensorEntry(name, path, dtype, shape, data_start + begin, nbytes))
    return entries
