"""``lib.data`` layouts of the bundle record that the hardware decoder emits.

One :class:`RecordLayout` value is the hardware twin of one
:class:`ptocube.model.bundle.BundleRecord`: a fault class with the index of the reporting
instruction, or (fault ``NONE``) a :class:`DescriptorLayout` holding everything the model's
:class:`~ptocube.model.bundle.Bundle` holds.  The preflight FSM consumes the same layout.

Conventions (so that a record has exactly one bit pattern per model record):

* A fault record carries an all-zero descriptor; a descriptor record has ``fault == NONE`` and
  ``fault_index == 0``.
* Lists (Local sources, destinations, Shared TIDs) are packed from element 0 in stream order;
  ``*_count`` says how many are valid and the unused elements are zero.
* Absent B.DATR / B.FPATR / B.IOR have their ``*_valid`` bit clear and all-zero fields.
* Each dimension holds its *resolved* value (1 when omitted) and a ``written`` bit.
* Instruction indices are counted modulo ``2**index_width``.

:meth:`RecordLayout.encode` / :meth:`RecordLayout.decode` convert between model records and
the integer bit pattern, so testbenches compare the two bit for bit.
"""

from dataclasses import replace

from amaranth.hdl import Shape
from amaranth.lib import data

from ..model.bundle import Bundle, BundleRecord, Datr, Destination, Fpatr, Operation
from ..model.faults import FaultClass
from .config import CubeConfig

__all__ = ["DatrLayout", "FpatrLayout", "IorLayout", "DimLayout", "DestinationLayout",
           "DescriptorLayout", "RecordLayout", "BoundExceeded", "Packer"]


class BoundExceeded(ValueError):
    """A model record does not fit the elaborated bounds (see :meth:`RecordLayout.encode`)."""


#: B.DATR fields (raw codes, as written).
DatrLayout = data.StructLayout({
    "layout": 5,
    "dtype": 5,
    "pad": 2,
    "cmode": 3,
    "rmode": 3,
    "sat": 1,
    "canonicalize": 1,
})

#: B.FPATR fields (raw codes, as written).
FpatrLayout = data.StructLayout({
    "pre_quant_mode": 6,
    "relu_mode": 3,
    "group_n_code": 4,
    "row_max_en": 1,
    "group_max_en": 1,
    "row_max_init": 1,
    "max_abs_en": 1,
    "trans_a": 1,
    "trans_b": 1,
})

#: B.IOR GPR selectors.
IorLayout = data.StructLayout({
    "reg_src0": 5,
    "reg_src1": 5,
    "reg_src2": 5,
    "reg_dst": 5,
})

#: One of LB0/LB1/LB2: resolved value (1 when omitted) and whether the bundle wrote it.
DimLayout = data.StructLayout({
    "value": 16,
    "written": 1,
})

#: One destination binding: hand (0 T, 1 U, 2 M, 3 N) and per-PE SizeCode (1..10).
DestinationLayout = data.StructLayout({
    "hand": 2,
    "size_code": 4,
})

_DATR_FIELDS = tuple(DatrLayout.members)
_FPATR_FIELDS = tuple(FpatrLayout.members)
_IOR_FIELDS = tuple(IorLayout.members)


def _leaves(layout, offset=0, path=()):
    """``(path, offset, width)`` of every leaf field of a (nested) layout."""
    if isinstance(layout, data.Layout):
        for name, field in layout:
            yield from _leaves(field.shape, offset + field.offset, path + (name,))
    else:
        yield path, offset, Shape.cast(layout).width


class Packer:
    """Fast conversion between nested dicts/lists of ints and a layout's bit pattern.

    Shared by every ``lib.data`` layout that testbenches and models convert in bulk (records
    here, tile descriptors in ``hdl/tile_desc.py``).  ``data.Const`` does the same but is too
    slow for the hundreds of thousands of records a regression compares; this walks a flat
    table of leaf offsets computed once.
    """

    def __init__(self, layout):
        self.leaves = list(_leaves(layout))

    def pack(self, values) -> int:
        """``values``: nested dicts (struct members) and lists (array elements); missing = 0."""
        bits = 0
        for path, offset, width in self.leaves:
            v = values
            for key in path:
                try:
                    v = v[key]
                except (KeyError, IndexError, TypeError):
                    v = 0
                    break
            v = int(v)
            if not 0 <= v < 1 << width:
                raise ValueError(f"{'.'.join(map(str, path))} = {v} does not fit {width} bits")
            bits |= v << offset
        return bits

    def unpack(self, bits: int) -> dict:
        """A nested dict (arrays as dicts keyed by index) of the leaf values of ``bits``."""
        out = {}
        for path, offset, width in self.leaves:
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = (bits >> offset) & ((1 << width) - 1)
        return out


class DescriptorLayout(data.StructLayout):
    """A decoded bundle (the model's :class:`~ptocube.model.bundle.Bundle`), bounded by a config.

    Parameters
    ----------
    config : CubeConfig
        ``max_local_sources``, ``max_destinations`` and ``max_shared`` size the lists.
    index_width : int
        Width of the instruction indices.
    """

    def __init__(self, config: CubeConfig = CubeConfig(), index_width: int = 32):
        self.config = config
        self.index_width = index_width
        super().__init__({
            "op": Operation,
            "a_type": 5,
            "b_type": 5,               # resolved: B.DATR DataType, AType if absent or 31
            "start_index": index_width,
            "boundary_index": index_width,
            "datr_valid": 1,
            "datr": DatrLayout,
            "fpatr_valid": 1,
            "fpatr": FpatrLayout,
            "dims": data.ArrayLayout(DimLayout, 3),          # LB0 = M, LB1 = N, LB2 = K
            "local_count": range(config.max_local_sources + 1),
            "local_sources": data.ArrayLayout(6, config.max_local_sources),
            "dest_count": range(config.max_destinations + 1),
            "destinations": data.ArrayLayout(DestinationLayout, config.max_destinations),
            "shared_count": range(config.max_shared + 1),
            "shared_sources": data.ArrayLayout(8, config.max_shared),
            "terminated": 1,
            "ior_valid": 1,
            "ior": IorLayout,
            "pe_mask": 4,
            "catr_dr": 1,
            "noop": 1,
        })
        self._packer = Packer(self)

    def fits(self, bundle: Bundle) -> bool:
        """Whether the lists of ``bundle`` fit the elaborated bounds."""
        return (len(bundle.local_sources) <= self.config.max_local_sources
                and len(bundle.destinations) <= self.config.max_destinations
                and len(bundle.shared_sources) <= self.config.max_shared)

    def encode(self, bundle: Bundle, noop: bool = False) -> int:
        """The bit pattern of a model bundle; raises :class:`BoundExceeded` if it does not fit."""
        if not self.fits(bundle):
            raise BoundExceeded(
                f"bundle has {len(bundle.local_sources)} Local sources, "
                f"{len(bundle.destinations)} destinations, {len(bundle.shared_sources)} Shared "
                f"sources; bounds are {self.config.max_local_sources}/"
                f"{self.config.max_destinations}/{self.config.max_shared}")
        mask = (1 << self.index_width) - 1
        return self._packer.pack({
            "op": bundle.op.value,
            "a_type": bundle.a_type,
            "b_type": bundle.b_type,
            "start_index": bundle.start_index & mask,
            "boundary_index": bundle.boundary_index & mask,
            "datr_valid": bundle.datr is not None,
            "datr": {f: getattr(bundle.datr, f) for f in _DATR_FIELDS} if bundle.datr else {},
            "fpatr_valid": bundle.fpatr is not None,
            "fpatr": {f: getattr(bundle.fpatr, f) for f in _FPATR_FIELDS} if bundle.fpatr else {},
            "dims": [{"value": bundle.dim(i), "written": bundle.dims[i] is not None}
                     for i in range(3)],
            "local_count": len(bundle.local_sources),
            "local_sources": list(bundle.local_sources),
            "dest_count": len(bundle.destinations),
            "destinations": [{"hand": d.hand, "size_code": d.size_code}
                             for d in bundle.destinations],
            "shared_count": len(bundle.shared_sources),
            "shared_sources": list(bundle.shared_sources),
            "terminated": bundle.terminated,
            "ior_valid": bundle.ior is not None,
            "ior": dict(zip(_IOR_FIELDS, bundle.ior)) if bundle.ior else {},
            "pe_mask": bundle.pe_mask,
            "catr_dr": bundle.catr_dr,
            "noop": noop,
        })

    def decode(self, bits: int) -> tuple[Bundle, bool]:
        """The model bundle (and the no-op flag) of a bit pattern."""
        v = self._packer.unpack(bits)
        datr = Datr(**v["datr"]) if v["datr_valid"] else None
        fpatr = None
        if v["fpatr_valid"]:
            # Cast each field to the type of the dataclass default (int codes, bool flags).
            fpatr = Fpatr(**{f: type(getattr(Fpatr(), f))(v["fpatr"][f]) for f in _FPATR_FIELDS})
        dims, dests = v["dims"], v["destinations"]
        bundle = Bundle(
            op=Operation(v["op"]),
            a_type=v["a_type"],
            start_index=v["start_index"],
            boundary_index=v["boundary_index"],
            datr=datr,
            fpatr=fpatr,
            dims=tuple(dims[i]["value"] if dims[i]["written"] else None for i in range(3)),
            local_sources=tuple(v["local_sources"][i] for i in range(v["local_count"])),
            destinations=tuple(Destination(dests[i]["hand"], dests[i]["size_code"])
                               for i in range(v["dest_count"])),
            shared_sources=tuple(v["shared_sources"][i] for i in range(v["shared_count"])),
            terminated=bool(v["terminated"]),
            ior=tuple(v["ior"][f] for f in _IOR_FIELDS) if v["ior_valid"] else None,
            pe_mask=v["pe_mask"],
            catr_dr=bool(v["catr_dr"]),
        )
        return bundle, bool(v["noop"])


class RecordLayout(data.StructLayout):
    """One record per bundle: ``fault`` (a :class:`FaultClass` code), ``fault_index``, ``bundle``.

    Parameters
    ----------
    config : CubeConfig
        Sizes the descriptor's lists.
    index_width : int
        Width of every instruction index in the record.
    """

    def __init__(self, config: CubeConfig = CubeConfig(), index_width: int = 32):
        self.descriptor = DescriptorLayout(config, index_width)
        self.index_width = index_width
        super().__init__({
            "fault": FaultClass,
            "fault_index": index_width,
            "bundle": self.descriptor,
        })
        self._bundle_offset = self["bundle"].offset
        self._index_offset = self["fault_index"].offset
        self._fault_offset = self["fault"].offset

    def encode(self, record: BundleRecord) -> int:
        """The bit pattern of a model record (:class:`BoundExceeded` if it does not fit)."""
        if record.ok:
            return self.descriptor.encode(record.bundle, record.noop) << self._bundle_offset
        index = record.fault_index & ((1 << self.index_width) - 1)
        return (record.fault.value << self._fault_offset) | (index << self._index_offset)

    def decode(self, bits: int) -> BundleRecord:
        """The model record of a bit pattern (``reason`` and ``words`` are left empty)."""
        fault = FaultClass((bits >> self._fault_offset) & 0b111)
        if fault is not FaultClass.NONE:
            index = (bits >> self._index_offset) & ((1 << self.index_width) - 1)
            return BundleRecord(fault=fault, fault_index=index)
        bundle, noop = self.descriptor.decode(bits >> self._bundle_offset)
        return BundleRecord(bundle=bundle, noop=noop)

    @staticmethod
    def normalized(record: BundleRecord) -> BundleRecord:
        """``record`` without its non-architectural parts, for comparisons."""
        return replace(record, reason="", words=())
