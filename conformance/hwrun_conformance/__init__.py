"""hwrun's conformance suite: every platform's own op implementations against the core's reference.

Modelled on llama.cpp's test-backend-ops, PyTorch OpInfo and the Khronos CTS. A *case* is a seeded
sample of an op's inputs plus the metric that compares an implementation's outputs with the
reference's (:mod:`hwrun_conformance.case`); the runner executes each case of each impl in a worker
process so that a crash or a hang becomes CRASH or TIMEOUT and the run goes on
(:mod:`hwrun_conformance.runner`). Run it as ``hwrun conformance --platform P`` or under pytest
(docs/conformance.md).
"""

from hwrun_conformance.status import CONFORMANT, Status

__all__ = ["CONFORMANT", "Status"]
