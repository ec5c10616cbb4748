"""The corpus: every *.py file of the Python standard library this interpreter ships.

Files are read in sorted path order; a file goes to the held-out split when the CRC-32 of its
path relative to the stdlib root is divisible by `HELD_OUT_MODULUS` (about 3% of files), so the
split does not move when files are added or removed elsewhere. Installed third-party packages
(site-packages, dist-packages) and files that are not UTF-8 are left out.

    python -m hwrun.default_model.train.build_corpus --out build/corpus
"""

from __future__ import annotations

import argparse
import json
import platform
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_MODULUS = 32
_THIRD_PARTY = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib root, with forward slashes
    text: str

    @property
    def held_out(self) -> bool:
        return zlib.crc32(self.path.encode()) % HELD_OUT_MODULUS == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources(root: Path | None = None) -> tuple[list[SourceFile], list[str]]:
    """Every readable stdlib *.py file in sorted order, and the paths skipped as not UTF-8."""
    root = root or stdlib_root()
    files, skipped = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _THIRD_PARTY & set(rel.parts) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            skipped.append(rel.as_posix())
            continue
        files.append(SourceFile(rel.as_posix(), text))
    return files, skipped


def write_corpus(out: Path) -> dict:
    """Writes train.jsonl / heldout.jsonl (one {"path", "text"} per line) and corpus.json."""
    out.mkdir(parents=True, exist_ok=True)
    files, skipped = stdlib_sources()
    counts = {"train": [0, 0], "heldout": [0, 0]}
    with (out / "train.jsonl").open("w") as train, (out / "heldout.jsonl").open("w") as held:
        for f in files:
            split = "heldout" if f.held_out else "train"
            (held if f.held_out else train).write(
                json.dumps({"path": f.path, "text": f.text}) + "\n"
            )
            counts[split][0] += 1
            counts[split][1] += len(f.text.encode())
    meta = {
        "source": "Python standard library *.py files",
        "python": platform.python_version(),
        "stdlib_root": str(stdlib_root()),
        "held_out_rule": f"crc32(relative path) % {HELD_OUT_MODULUS} == 0",
        "files": {k: v[0] for k, v in counts.items()},
        "bytes": {k: v[1] for k, v in counts.items()},
        "skipped_not_utf8": skipped,
    }
    (out / "corpus.json").write_text(json.dumps(meta, indent=1))
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    meta = write_corpus(parser.parse_args().out)
    print(json.dumps({k: meta[k] for k in ("python", "files", "bytes")}))


if __name__ == "__main__":
    main()
