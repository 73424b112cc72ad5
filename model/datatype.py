"""The PTO Tile DataType code table and its static properties.

One 5-bit code names an element type in typed BSTART words (bits 31:27) and in
B.DATR (bits 24:20).  This module is the single source of truth for the codes,
their widths and their numeric classes; the numeric value of an element is
decoded in :mod:`ptocube.model.numeric`.
"""

import enum

__all__ = ["DataType", "NumClass", "DTYPE_NONE", "RESERVED_CODES",
           "ORDINARY_MATRIX_TYPES", "MX_MATRIX_TYPES", "MX_SCALED_TYPES",
           "TIMG2COL_TYPES", "accumulator_type"]


class NumClass(enum.Enum):
    """Numeric class of a DataType (the Matrix type-pair rule works per class)."""
    FLOAT = "float"
    SIGNED = "signed"
    UNSIGNED = "unsigned"


class DataType(enum.IntEnum):
    """Tile element data types, valued by their 5-bit encoding."""

    FP64 = 0
    FP32 = 1
    TF32 = 2
    HF32 = 3
    FP16 = 4
    BF16 = 5
    HiF8 = 6
    E4M3 = 7
    E5M2 = 8
    E3M2 = 9
    E2M3 = 10
    E2M1X2 = 11
    E1M2X2 = 12
    E8M0 = 13
    HiF4X2 = 14
    S64 = 16
    S32 = 17
    S16 = 18
    S8 = 19
    S4X2 = 20
    U64 = 24
    U32 = 25
    U16 = 26
    U8 = 27
    U4X2 = 28

    @property
    def bits(self) -> int:
        """Storage bits per logical element (4 for the packed X2 lanes)."""
        return _BITS[self]

    @property
    def num_class(self) -> NumClass:
        """Floating, signed or unsigned."""
        if self.value <= 14:
            return NumClass.FLOAT
        if self.value <= 20:
            return NumClass.SIGNED
        return NumClass.UNSIGNED

    @property
    def packed(self) -> bool:
        """True for the two-lanes-per-byte 4-bit types."""
        return self.bits == 4


_BITS = {
    DataType.FP64: 64, DataType.FP32: 32, DataType.TF32: 32, DataType.HF32: 32,
    DataType.FP16: 16, DataType.BF16: 16, DataType.HiF8: 8, DataType.E4M3: 8,
    DataType.E5M2: 8, DataType.E3M2: 8, DataType.E2M3: 8, DataType.E2M1X2: 4,
    DataType.E1M2X2: 4, DataType.E8M0: 8, DataType.HiF4X2: 4,
    DataType.S64: 64, DataType.S32: 32, DataType.S16: 16, DataType.S8: 8,
    DataType.S4X2: 4,
    DataType.U64: 64, DataType.U32: 32, DataType.U16: 16, DataType.U8: 8,
    DataType.U4X2: 4,
}

#: B.DATR DataType code 31: "no type" (keeps AType).  Not a DataType.
DTYPE_NONE = 31

#: Codes that name no DataType (31 is additionally DTYPE_NONE in B.DATR).
RESERVED_CODES = frozenset({15, 21, 22, 23, 29, 30, 31})

#: Inputs accepted by the ordinary (non-MX) Matrix operations.
ORDINARY_MATRIX_TYPES = frozenset({
    DataType.FP32, DataType.TF32, DataType.HF32, DataType.FP16, DataType.BF16,
    DataType.HiF8, DataType.E4M3, DataType.E5M2, DataType.E3M2, DataType.E2M3,
    DataType.E2M1X2, DataType.E1M2X2,
    DataType.S16, DataType.S8, DataType.S4X2,
    DataType.U16, DataType.U8, DataType.U4X2,
})

#: Inputs accepted by each side of an MX Matrix operation.
MX_MATRIX_TYPES = frozenset({
    DataType.FP16, DataType.BF16, DataType.E4M3, DataType.E5M2,
    DataType.E2M1X2, DataType.E1M2X2,
})

#: MX side types that require an E8M0 scale operand (FP16/BF16 carry none).
MX_SCALED_TYPES = frozenset({
    DataType.E4M3, DataType.E5M2, DataType.E2M1X2, DataType.E1M2X2,
})

#: Element types TIMG2COL accepts (source and destination alike).
TIMG2COL_TYPES = frozenset({
    DataType.FP32, DataType.FP16, DataType.BF16, DataType.S32, DataType.S16,
    DataType.S8, DataType.U32, DataType.U16, DataType.U8,
})


def accumulator_type(a_type: DataType) -> DataType:
    """The private accumulator type for an input class: FP32, S32 or U32."""
    return {NumClass.FLOAT: DataType.FP32, NumClass.SIGNED: DataType.S32,
            NumClass.UNSIGNED: DataType.U32}[a_type.num_class]
