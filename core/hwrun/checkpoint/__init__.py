"""Checkpoint loading: safetensors tensors read one at a time, MoE layers streamed and requantized.

- ``safetensors_reader``: the tensor table of a checkpoint and single-tensor reads.
- ``moe_names``: the MoE tensors a checkpoint holds (names, dtypes, shapes) for a config.
- ``moe_loader``: ``load_moe_layers``, FP8 experts re-quantized to MXFP4 layer by layer.
"""

from hwrun.checkpoint.moe_loader import MoELayerWeights, MoEModelWeights, load_moe_layers
from hwrun.checkpoint.moe_names import MoECheckpointConfig
from hwrun.checkpoint.safetensors_reader import CheckpointError, SafetensorsCheckpoint

__all__ = [
    "CheckpointError",
    "MoECheckpointConfig",
    "MoELayerWeights",
    "MoEModelWeights",
    "SafetensorsCheckpoint",
    "load_moe_layers",
]
