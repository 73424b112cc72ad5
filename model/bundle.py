"""The bundle descriptor: what the decoder hands to preflight and execution.

A *bundle* is a typed BSTART, its header commands (B.DATR, B.FPATR, B.DIM,
B.IOT, B.IOS, B.IOR, ...) and the boundary that completes it.  Decoding a word
stream (:mod:`ptocube.model.decode`) turns each bundle into one
:class:`BundleRecord`: either a :class:`Bundle` descriptor, or the fault that
the decode/header rules raise and the index of the reporting instruction.
The hardware decoder produces the same record, so these classes are also the
reference for its ``lib.data`` layout.
"""

import enum
from dataclasses import dataclass, field

from .faults import FaultClass

__all__ = ["Operation", "Fpatr", "Datr", "Destination", "Bundle", "BundleRecord",
           "pe_mask_of_pemode", "PEMODE_OF_MASK", "hand_of_selector"]


class Operation(enum.IntEnum):
    """Operations the CUBE unit executes, valued by CUBE function number.

    TIMG2COL is carried by BSTART.TEPL (Mode 3, Function 4); it gets the
    otherwise unused value 32.
    """

    TMATMUL = 0
    TMATMUL_BIAS = 1
    TMATMUL_ACC = 2
    TMATMUL_MX = 4
    TMATMUL_MX_BIAS = 5
    TMATMUL_MX_ACC = 6
    TGEMV = 16
    TGEMV_BIAS = 17
    TGEMV_ACC = 18
    TGEMV_MX = 20
    TGEMV_MX_BIAS = 21
    TGEMV_MX_ACC = 22
    TIMG2COL = 32

    @property
    def is_matrix(self) -> bool:
        return self is not Operation.TIMG2COL

    @property
    def uses_bias(self) -> bool:
        return self.is_matrix and (self.value & 0x3) == 1

    @property
    def uses_acc(self) -> bool:
        return self.is_matrix and (self.value & 0x3) == 2

    @property
    def is_mx(self) -> bool:
        return self.is_matrix and bool(self.value & 0x4)

    @property
    def is_gemv(self) -> bool:
        return self.is_matrix and bool(self.value & 0x10)

    @property
    def mnemonic(self) -> str:
        """Block mnemonic, e.g. ``BSTART.TMATMULMX.ACC`` (TIMG2COL: ``TIMG2COL``)."""
        if self is Operation.TIMG2COL:
            return "TIMG2COL"
        base = "TGEMV" if self.is_gemv else "TMATMUL"
        if self.is_mx:
            base += "MX"
        if self.uses_bias:
            base += ".BIAS"
        elif self.uses_acc:
            base += ".ACC"
        return "BSTART." + base


#: B.IOT/B.IOS PEMode (3 bits) -> 4-bit PE mask, PE0 in bit 3 (written first).
_PEMODE_TO_MASK = (0b0000, 0b1000, 0b0100, 0b0010, 0b0001, 0b1100, 0b1110, 0b1111)
PEMODE_OF_MASK = {mask: mode for mode, mask in enumerate(_PEMODE_TO_MASK)}


def pe_mask_of_pemode(pemode: int) -> int:
    """Expand a 3-bit PEMode into the 4-bit PE mask (PE0 = bit 3)."""
    return _PEMODE_TO_MASK[pemode]


def hand_of_selector(selector: int) -> tuple[int, int]:
    """Split a 6-bit tile selector into (hand 0..3 = T,U,M,N; n 1..16)."""
    return selector >> 4, (selector & 0xF) + 1


@dataclass(frozen=True)
class Fpatr:
    """B.FPATR fields (post-processing attributes)."""
    pre_quant_mode: int = 0
    relu_mode: int = 0
    group_n_code: int = 0
    row_max_en: bool = False
    group_max_en: bool = False
    row_max_init: bool = False
    max_abs_en: bool = False
    trans_a: bool = False
    trans_b: bool = False


@dataclass(frozen=True)
class Datr:
    """B.DATR fields.  In a Matrix bundle only dtype (BType), rmode and sat may be nonzero."""
    layout: int = 0
    dtype: int = 0          # raw 5-bit code; 31 = DTYPE_NONE
    pad: int = 0
    cmode: int = 0
    rmode: int = 0
    sat: int = 0
    canonicalize: int = 0


@dataclass(frozen=True)
class Destination:
    """One destination binding: the hand of the new tile and its per-PE SizeCode."""
    hand: int        # 0 T, 1 U, 2 M, 3 N
    size_code: int   # 1..10: 128 B << (code - 1) per participating PE

    @property
    def tsize(self) -> int:
        return 128 << (self.size_code - 1)


@dataclass(frozen=True)
class Bundle:
    """A decoded bundle that passed every decode- and header-time rule.

    Fields hold what the words said; defaults (M/N/K = 1, BType = AType) are
    resolved by the properties, legality of combinations by preflight.
    """

    op: Operation
    a_type: int                                # raw 5-bit DataType code of the start
    start_index: int                           # instruction index of the BSTART
    boundary_index: int                        # instruction index of the completing boundary
    datr: Datr | None = None
    fpatr: Fpatr | None = None
    dims: tuple = (None, None, None)           # LB0, LB1, LB2 as written (None = omitted)
    local_sources: tuple = ()                  # 6-bit selectors in stream order
    destinations: tuple = ()                   # Destination records in stream order
    shared_sources: tuple = ()                 # SharedTIDs in stream order
    terminated: bool = False                   # an effective B.IOT carried L = 1
    ior: tuple | None = None                   # (RegSrc0, RegSrc1, RegSrc2, RegDst) or None
    pe_mask: int = 0                           # common mask of the effective bindings
    catr_dr: bool = False                      # B.CATR DR bit (illegal in CUBE bundles)

    def dim(self, i: int) -> int:
        """Resolved LBi: the written value, or 1 when omitted."""
        v = self.dims[i]
        return 1 if v is None else v

    @property
    def b_type(self) -> int:
        """Raw BType code: B.DATR DataType, AType when B.DATR is absent or DTYPE_NONE."""
        if self.datr is None or self.datr.dtype == 31:
            return self.a_type
        return self.datr.dtype

    @property
    def rmode(self) -> int:
        return 0 if self.datr is None else self.datr.rmode

    @property
    def sat(self) -> int:
        return 0 if self.datr is None else self.datr.sat


@dataclass(frozen=True)
class BundleRecord:
    """One record per bundle: a descriptor, or a fault with its reporting index.

    A bundle whose effective bindings all had PE mask 0000 completes as a strict
    no-op: ``bundle`` is set and ``noop`` is True.
    """

    bundle: Bundle | None = None
    fault: FaultClass = FaultClass.NONE
    fault_index: int | None = None
    reason: str = ""
    noop: bool = False
    words: tuple = field(default=(), compare=False)   # (index, length_bits, value) of the bundle's words

    @property
    def ok(self) -> bool:
        return self.fault is FaultClass.NONE
