"""Enums and dtype names: TE-FL's BackendImplKind and TransformerEngine's enums."""
from __future__ import annotations

import enum
import sys


class BackendImplKind(str, enum.Enum):
    """Kind of an implementation; the value is its policy token."""

    DEFAULT = "flagos"
    VENDOR = "vendor"
    REFERENCE = "reference"

    def __str__(self) -> str:  # "vendor", as TE-FL prints it
        return self.value


# libtefl's tefl_impl_kind values.
KIND_TO_INT = {BackendImplKind.DEFAULT: 0, BackendImplKind.VENDOR: 1, BackendImplKind.REFERENCE: 2}
INT_TO_KIND = {v: k for k, v in KIND_TO_INT.items()}


class DType(enum.IntEnum):
    """transformer_engine_torch.DType."""

    kByte = 0
    kInt16 = 1
    kInt32 = 2
    kInt64 = 3
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat8E8M0 = 9
    kFloat4E2M1 = 10


class NVTE_Mask_Type(enum.IntEnum):
    NVTE_NO_MASK = 0
    NVTE_PADDING_MASK = 1
    NVTE_CAUSAL_MASK = 2
    NVTE_PADDING_CAUSAL_MASK = 3
    NVTE_CAUSAL_BOTTOM_RIGHT_MASK = 4
    NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5


class NVTE_QKV_Format(enum.IntEnum):
    NVTE_SBHD = 0
    NVTE_BSHD = 1
    NVTE_THD = 2


class NVTE_Bias_Type(enum.IntEnum):
    NVTE_NO_BIAS = 0
    NVTE_PRE_SCALE_BIAS = 1
    NVTE_POST_SCALE_BIAS = 2
    NVTE_ALIBI = 3


class NVTE_Softmax_Type(enum.IntEnum):
    NVTE_VANILLA_SOFTMAX = 0
    NVTE_OFF_BY_ONE_SOFTMAX = 1
    NVTE_LEARNABLE_SOFTMAX = 2


class NVTE_Fused_Attn_Backend(enum.IntEnum):
    NVTE_No_Backend = -1
    NVTE_F16_max512_seqlen = 0
    NVTE_F16_arbitrary_seqlen = 1
    NVTE_FP8 = 2


TE_ENUMS = (DType, NVTE_Mask_Type, NVTE_QKV_Format, NVTE_Bias_Type, NVTE_Softmax_Type, NVTE_Fused_Attn_Backend)

# DType -> tefl dtype name (libtefl's names, which are torch's and numpy's).
DTYPE_NAMES = {
    DType.kByte: "uint8",
    DType.kInt16: "int16",
    DType.kInt32: "int32",
    DType.kInt64: "int64",
    DType.kFloat32: "float32",
    DType.kFloat16: "float16",
    DType.kBFloat16: "bfloat16",
    DType.kFloat8E4M3: "float8_e4m3fn",
    DType.kFloat8E5M2: "float8_e5m2",
    DType.kFloat8E8M0: "float8_e8m0fnu",
    DType.kFloat4E2M1: "float4_e2m1fn",
}
NAME_TO_DTYPE = {v: k for k, v in DTYPE_NAMES.items()}


def dtype_name(dtype) -> str:
    """A tefl dtype name for a DType, torch.dtype, numpy dtype or name."""
    if isinstance(dtype, DType):
        return DTYPE_NAMES[dtype]
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return DTYPE_NAMES[DType(dtype)]
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
    else:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(dtype, torch.dtype):
            name = str(dtype).replace("torch.", "")
        elif type(dtype).__name__ == "DType" and hasattr(dtype, "__int__"):
            # TransformerEngine's own pybind11 DType (transformer_engine_torch_nv.DType)
            return DTYPE_NAMES[DType(int(dtype))]
        else:
            import numpy as np

            name = np.dtype(dtype).name
    aliases = {"float": "float32", "half": "float16", "bf16": "bfloat16", "double": "float64", "fp32": "float32",
               "fp16": "float16", "uint8": "uint8", "bool": "bool"}
    return aliases.get(name, name)
