"""Run the collectives' group checks (tests/collectives/group_checks.py) at several world sizes.

On a machine with W GPUs: `python bench/collectives_group_checks.py --backend nccl --world 2 4 8`
(one process per GPU, tensors on 'cuda'); on CPU: `--backend gloo --world 4 8`. Run from the
repository root with `PYTHONPATH=core:conformance:.` when hwrun is not installed. Keep NVLink
multicast off on multi-GPU machines (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1). Exits 1 when any world size fails.
"""

import argparse
import sys
import time

from hwrun.collectives.launch import spawn_group
from tests.collectives import group_checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--deadline", type=float, default=120.0, help="Seconds per world size.")
    args = parser.parse_args()
    device = "cuda" if args.backend == "nccl" else "cpu"
    failed = 0
    for world in args.world:
        start = time.perf_counter()
        try:
            results = spawn_group(
                group_checks.run_all,
                world,
                (device,),
                backend=args.backend,
                deadline_s=args.deadline,
            )
        except Exception as exc:
            failed += 1
            print(
                f"{args.backend} W={world}: FAILED after {time.perf_counter() - start:.1f} s\n{exc}"
            )
            continue
        problems = {k: v for k, v in results[0].items() if isinstance(v, list) and v}
        status = "ok" if not problems else f"MISMATCH {problems}"
        failed += bool(problems)
        seconds = time.perf_counter() - start
        print(
            f"{args.backend} W={world} on {device}: {status} in {seconds:.1f} s "
            f"(adversarial top-k rows through the resend round: {results[0]['resent_rows']}, "
            f"the tie round: {results[0]['tie_rows']})"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
