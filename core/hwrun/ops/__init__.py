"""Op contracts and their pure-PyTorch references (the definition of every op)."""

from hwrun.ops.catalogue import catalogue
from hwrun.ops.contract import OpContract

__all__ = ["OpContract", "catalogue"]
