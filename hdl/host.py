"""The host port of :class:`~ptocube.hdl.top.CubeUnit`: layouts, codes and a pure-Python codec.

A host (the simulation harness, a Verilator harness, an FPGA self-test) loads architectural
state into the unit and reads results back through two plain streams:

* ``host_cmd`` (in, :data:`HostCommandLayout`, 96 bits): ``op`` (:class:`HostOp`), ``space``
  (:class:`~ptocube.hdl.tile_port.MemSpace`: PE0..PE3, SHARED), ``index`` (register number,
  GPR number), ``addr`` (word offset, flag-word number, descriptor part, system register)
  and 64-bit ``data``.
* ``host_rsp`` (out, :data:`HostResponseLayout`, 65 bits): exactly one response per command,
  in order: ``data`` and ``error``.  With ``error`` set, ``data`` is a :class:`HostError`
  code and the command had no effect.

``docs/hdl-top.md`` ("Host port") is the reference of every command.  The unit takes host
commands only while no bundle is in the preflight or an engine (``host_cmd.ready`` is low
otherwise), so a host that waits for a bundle's status before reading sees its results.

Everything here is plain Python except the layouts; :func:`encode_command` /
:func:`decode_command` and :func:`encode_response` / :func:`decode_response` convert between
integers (the port bit patterns) and named fields, so a C++ or Python harness needs nothing
but the bit positions listed in :data:`COMMAND_FIELDS` and :data:`RESPONSE_FIELDS`.
"""

import enum as py_enum
from dataclasses import dataclass

from amaranth.lib import data, enum

from ..model.faults import FaultClass
from .img2col import FM_PARTS
from .tile_port import MemSpace

__all__ = ["HostOp", "HostError", "SysReg", "StatusOutcome", "HostCommandLayout",
           "HostResponseLayout", "StatusLayout", "COMMAND_FIELDS", "RESPONSE_FIELDS",
           "STATUS_FIELDS", "DESC_PARTS", "FM_PARTS", "DESC_PART_BASE", "DESC_PART_UNDEFINED",
           "HostCommand", "HostResponse", "BundleStatus", "encode_command", "decode_command",
           "encode_response", "decode_response", "decode_status", "split_parts", "join_parts",
           "build_info"]


class HostOp(enum.Enum, shape=5):
    """Host command codes (``docs/hdl-top.md``, "Host port", has one row per code)."""
    NOP = 0           # answers 0: a ping, and a way to wait for the unit to be idle
    DESC_PART = 1     # staging descriptor part ``addr`` (0, 1) <- data
    CONFIGURE = 2     # (space, index) <- staged descriptor; places it, answers the base CELL
    FREE = 3          # release (space, index) and its payload
    WRITE_WORD = 4    # payload word ``addr`` of (space, index) <- data
    READ_WORD = 5     # payload word ``addr`` of (space, index)
    WRITE_FLAGS = 6   # definedness flags of slots 64*addr .. 64*addr+63 <- data (bit i: slot)
    READ_FLAGS = 7    # those flags
    SET_UNDEFINED = 8  # per-register count of undefined valid elements <- data
    READ_DESC = 9     # part ``addr`` of (space, index)'s descriptor (DESC_PART_* for extras)
    WRITE_FM = 10     # feature-map descriptor part ``addr`` (0..5) of (PEn, index) <- data
    READ_FM = 11      # that part
    WRITE_GPR = 12    # GPR ``index`` <- data (GPR0 refused)
    READ_GPR = 13     # GPR ``index``
    WRITE_SYS = 14    # system register ``addr`` (:class:`SysReg`) <- data
    READ_SYS = 15     # system register ``addr``


class HostError(enum.Enum, shape=4):
    """Why a command was refused (the response's ``data`` when ``error`` is set)."""
    NONE = 0
    BAD_OP = 1          # unknown op code
    BAD_SPACE = 2       # space code 5..7, or a PE-only command on SHARED
    BAD_INDEX = 3       # register >= 64 on a PE, GPR >= 24, GPR0 written, unknown SysReg
    NOT_ALLOCATED = 4   # the register holds no tile
    ALLOCATED = 5       # CONFIGURE on a register that holds a tile (FREE it first)
    BAD_DESCRIPTOR = 6  # staged descriptor not allocated / zero or oversized capacity
    NO_SPACE = 7        # the payload does not fit the build's memory (implementation limit)
    OUT_OF_RANGE = 8    # word, flag word or part beyond the register / descriptor
    READ_ONLY = 9       # WRITE_SYS on a read-only system register
    NOT_EXPLICIT = 10   # READ_FLAGS of a published CUBE-layout output (implicit flags)


class SysReg(enum.Enum, shape=16):
    """System registers of READ_SYS / WRITE_SYS (``addr``)."""
    TILE_CAPACITY = 0     # bytes (read/write)
    STATUS = 1            # sticky numeric flags NV DZ OF UF NX in bits 4..0 (read/write)
    CAPACITY_IN_USE = 2   # bytes charged against TILE_CAPACITY (read only)
    ALLOCATED = 3         # bit i: TileIndex i is held by some PE (read only)
    BUILD = 4             # :func:`build_info` of the elaborated config (read only)


class StatusOutcome(enum.Enum, shape=2):
    """How a bundle ended (``status`` stream)."""
    SUCCESS = 0
    NOOP = 1
    FAULT = 2


#: ``host_cmd`` payload (96 bits).
HostCommandLayout = data.StructLayout({
    "op": HostOp,
    "space": MemSpace,
    "index": 8,
    "addr": 16,
    "data": 64,
})

#: ``host_rsp`` payload (65 bits).
HostResponseLayout = data.StructLayout({"data": 64, "error": 1})

#: ``status`` payload: one item per bundle (106 bits).  ``fault``/``fault_index`` are zero
#: unless FAULT; ``flags`` are the numeric flags the bundle ORed into the sticky status;
#: ``pe_mask`` (PE0 = bit 3) and ``outputs`` (``valid`` + TileIndex, in B.IOT order) name the
#: registers a SUCCESS published; ``cycles`` counts from the bundle's record leaving the decoder
#: to its status (saturating); ``op`` is the bundle's Operation code when ``op_valid`` (a
#: decode-fault record carries none).
StatusLayout = data.StructLayout({
    "outcome": StatusOutcome,
    "fault": FaultClass,
    "fault_index": 32,
    "flags": 5,
    "pe_mask": 4,
    "outputs": data.ArrayLayout(data.StructLayout({"valid": 1, "index": 6}), 3),
    "cycles": 32,
    "op_valid": 1,
    "op": 6,
})


def _offsets(layout):
    return {name: (field.offset, field.width) for name, field in layout}


#: Bit (offset, width) of each field in the port bit patterns, for foreign harnesses.
COMMAND_FIELDS = _offsets(HostCommandLayout)
RESPONSE_FIELDS = _offsets(HostResponseLayout)
STATUS_FIELDS = _offsets(StatusLayout)

#: 64-bit parts of a staged / read descriptor (TileDescLayout 68 bits, SharedDescLayout 77).
DESC_PARTS = 2
#: READ_DESC extra parts: the payload's base CELL, the undefined-valid-element count.
DESC_PART_BASE = 2
DESC_PART_UNDEFINED = 3


@dataclass(frozen=True)
class HostCommand:
    """One host command with named fields (``op`` a :class:`HostOp`, ``space`` an int 0..7)."""
    op: HostOp
    space: int = 0
    index: int = 0
    addr: int = 0
    data: int = 0


@dataclass(frozen=True)
class HostResponse:
    """One host response; ``error`` is a :class:`HostError` (NONE when accepted)."""
    data: int
    error: HostError = HostError.NONE

    @property
    def ok(self) -> bool:
        """The command was accepted."""
        return self.error is HostError.NONE


@dataclass(frozen=True)
class BundleStatus:
    """One item of the ``status`` stream, decoded."""
    outcome: StatusOutcome
    fault: FaultClass
    fault_index: int
    flags: int
    pe_mask: int
    outputs: tuple          # TileIndex of each valid output entry, in B.IOT order
    cycles: int
    op: int | None          # Operation code, None for a decode-fault record


def _field(bits, fields, name):
    offset, width = fields[name]
    return (bits >> offset) & ((1 << width) - 1)


def _put(fields, name, value):
    offset, width = fields[name]
    value = int(value)
    if not 0 <= value < 1 << width:
        raise ValueError(f"host command field {name}={value} does not fit {width} bits")
    return value << offset


def encode_command(cmd: HostCommand) -> int:
    """The ``host_cmd`` bit pattern of a command; ValueError for a field that does not fit."""
    op = cmd.op.value if isinstance(cmd.op, py_enum.Enum) else int(cmd.op)
    space = cmd.space.value if isinstance(cmd.space, py_enum.Enum) else int(cmd.space)
    return (_put(COMMAND_FIELDS, "op", op) | _put(COMMAND_FIELDS, "space", space)
            | _put(COMMAND_FIELDS, "index", cmd.index) | _put(COMMAND_FIELDS, "addr", cmd.addr)
            | _put(COMMAND_FIELDS, "data", cmd.data))


def decode_command(bits: int) -> HostCommand:
    """Inverse of :func:`encode_command` (an unknown op code stays an int)."""
    op = _field(bits, COMMAND_FIELDS, "op")
    return HostCommand(HostOp(op) if op in {o.value for o in HostOp} else op,
                       _field(bits, COMMAND_FIELDS, "space"), _field(bits, COMMAND_FIELDS, "index"),
                       _field(bits, COMMAND_FIELDS, "addr"), _field(bits, COMMAND_FIELDS, "data"))


def encode_response(rsp: HostResponse) -> int:
    """The ``host_rsp`` bit pattern of a response."""
    if rsp.ok:
        return _put(RESPONSE_FIELDS, "data", rsp.data)
    return (_put(RESPONSE_FIELDS, "data", rsp.error.value) | _put(RESPONSE_FIELDS, "error", 1))


def decode_response(bits: int) -> HostResponse:
    """Inverse of :func:`encode_response`."""
    value = _field(bits, RESPONSE_FIELDS, "data")
    if _field(bits, RESPONSE_FIELDS, "error"):
        return HostResponse(0, HostError(value))
    return HostResponse(value)


def decode_status(bits: int) -> BundleStatus:
    """A ``status`` bit pattern as a :class:`BundleStatus`."""
    v = data.Const(StatusLayout, bits)
    outputs = tuple(int(o.index) for o in v.outputs if o.valid)
    return BundleStatus(StatusOutcome(v.outcome), FaultClass(v.fault),
                        int(v.fault_index), int(v.flags), int(v.pe_mask), outputs, int(v.cycles),
                        int(v.op) if v.op_valid else None)


def split_parts(bits: int, parts: int) -> list[int]:
    """A descriptor bit pattern as ``parts`` 64-bit words, least significant first."""
    return [(bits >> (64 * k)) & (2**64 - 1) for k in range(parts)]


def join_parts(words) -> int:
    """Inverse of :func:`split_parts`."""
    return sum(int(w) << (64 * k) for k, w in enumerate(words))


def build_info(config) -> int:
    """READ_SYS BUILD value: rows [7:0], cols [15:8], int/float/mx types [18:16], Local CELLs
    per PE [47:32], Shared CELLs [63:48]."""
    return (config.rows | config.cols << 8 | int(config.int_types) << 16
            | int(config.float_types) << 17 | int(config.mx_types) << 18
            | (config.tile_bytes_per_pe // 128) << 32 | (config.shared_bytes // 128) << 48)
