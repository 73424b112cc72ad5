"""Bit-exact golden model of the PTO ISA CUBE matrix unit and TIMG2COL.

Structured like the specification: :mod:`.isa` (encodings), :mod:`.decode`
(bundle decode), :mod:`.preflight` (legality, in the spec's order),
:mod:`.execute` (arithmetic) and :mod:`.machine` (architectural state and
atomic publication).
"""
