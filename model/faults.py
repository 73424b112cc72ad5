"""Architectural fault classes and the exception that carries them.

The PTO ISA reports a rejected instruction or bundle as one of a small set of
fault classes.  The golden model raises :class:`PTOFault`; the hardware reports
the same class as a :class:`FaultClass` code on its status output, so the two
can be compared directly.
"""

import enum

__all__ = ["FaultClass", "PTOFault"]


class FaultClass(enum.IntEnum):
    """Fault classes a CUBE Matrix or TIMG2COL bundle can raise.

    The integer values are the hardware status codes (0 means success).
    """

    NONE = 0
    ILLEGAL_INSTRUCTION = 1
    BUNDLE_CONTROL = 2
    TILE_LEGALITY = 3
    TILE_ALLOCATION = 4

    @property
    def spec_name(self) -> str:
        """The name the specification uses, e.g. ``Fault_TileLegality``."""
        return _SPEC_NAMES[self]

    @classmethod
    def from_spec_name(cls, name: str) -> "FaultClass":
        """Inverse of :attr:`spec_name`."""
        for fault, spec in _SPEC_NAMES.items():
            if spec == name:
                return fault
        raise ValueError(f"unknown fault class name {name!r}")


_SPEC_NAMES = {
    FaultClass.NONE: "None",
    FaultClass.ILLEGAL_INSTRUCTION: "Fault_IllegalInstruction",
    FaultClass.BUNDLE_CONTROL: "Fault_BundleControl",
    FaultClass.TILE_LEGALITY: "Fault_TileLegality",
    FaultClass.TILE_ALLOCATION: "Fault_TileAllocation",
}


class PTOFault(Exception):
    """A fault raised by the golden model.

    ``fault`` is the :class:`FaultClass`; ``reason`` a short human-readable
    explanation naming the failed rule (for error messages and debugging; it is
    not architectural).  ``index`` is the zero-based instruction index that
    reports the fault, filled in by the bundle decoder when known.
    """

    def __init__(self, fault: FaultClass, reason: str, index: int | None = None):
        super().__init__(f"{fault.spec_name}: {reason}")
        self.fault = fault
        self.reason = reason
        self.index = index
