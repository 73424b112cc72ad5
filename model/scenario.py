"""Scenario files: an initial architectural state plus a program, as JSON.

The format is documented for users in ``docs/scenario-format.md``; in short::

    {
      "name": "...", "description": "...",
      "arithmetic": "ieee",                      # or "pto-v0"
      "gprs": {"a0": "0x40000000"},
      "status": ["NV"],                          # initial sticky flags
      "tile_capacity": 262144,                   # core tile capacity limit
      "tiles": {"all": {"M": [TILE, ...]}, "PE2": {"T": [TILE]}},
      "shared": {"S9": TILE},
      "program": "BSTART.TMATMUL S8\\n..."       # or a list of lines,
                                                 # or "program_file": "x.s"
    }

A TILE lists ``dtype``, ``layout``, ``data`` (rows of element values, raw
``"0x.."`` bit patterns, or ``null`` for an undefined element) or
``shape`` + ``fill``, and optionally ``tsize``, ``cols``, ``location`` and
``feature_map``; Shared tiles add ``allocation_mask``, ``initialized_mask``
and ``published``.  Tiles of a hand are given in allocation order: the
k-th entry is register ``#k`` (``null`` leaves that register free).

:func:`load_scenario` validates everything and raises :class:`ScenarioError`
naming the offending key and what was expected.
"""

import json
import math
import pathlib
import re
from dataclasses import dataclass

import numpy as np

from .asm import AsmError, assemble
from .datatype import DataType
from .execute import ARITHMETIC_MODES
from .img2col import FeatureMapDescriptor
from .isa import GPR_NAMES, HANDS
from .layout import (CELL_BYTES, LOCAL_MAX_CAPACITY_BYTES, SHARED_MAX_CAPACITY_BYTES, Layout,
                     cube_geometry)
from .faults import PTOFault
from .numeric import encode_exact
from .state import PE_COUNT, Location, SharedTile, State, StatusFlag, Tile

__all__ = ["Scenario", "ScenarioError", "load_scenario", "parse_scenario", "gpr_number"]

_TILE_KEYS = {"dtype", "layout", "data", "shape", "fill", "tsize", "cols", "location",
              "feature_map"}
_SHARED_KEYS = _TILE_KEYS - {"feature_map"} | {"allocation_mask", "initialized_mask",
                                                "published"}
_TOP_KEYS = {"name", "description", "arithmetic", "gprs", "status", "tile_capacity", "tiles",
             "shared", "program", "program_file"}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB)?\s*$", re.IGNORECASE)


class ScenarioError(ValueError):
    """A malformed scenario: ``key`` is the path of the offending entry."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.message = message


@dataclass
class Scenario:
    """A loaded scenario: a ready :class:`State`, the program text and the arithmetic."""
    name: str
    description: str
    state: State
    program: str
    arithmetic: str = "ieee"
    path: pathlib.Path | None = None


def load_scenario(path) -> Scenario:
    """Read and validate a scenario file (a ``program_file`` is relative to it)."""
    path = pathlib.Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError("", f"cannot read scenario {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError("", f"{path} is not valid JSON: {exc}") from exc
    return parse_scenario(data, base=path.parent, path=path)


def parse_scenario(data, base=None, path=None) -> Scenario:
    """Validate a scenario given as a parsed JSON object."""
    _expect(isinstance(data, dict), "", "expected a JSON object at the top level")
    unknown = set(data) - _TOP_KEYS
    _expect(not unknown, _first(unknown), f"unknown key; expected one of {sorted(_TOP_KEYS)}")
    state = State()
    arithmetic = data.get("arithmetic", "ieee")
    _expect(arithmetic in ARITHMETIC_MODES, "arithmetic", f"expected one of {ARITHMETIC_MODES}")
    if "tile_capacity" in data:
        cap = data["tile_capacity"]
        _expect(_is_int(cap) and 0 < cap <= 262144 and cap % CELL_BYTES == 0, "tile_capacity",
                "expected a multiple of 128 bytes, at most 262144")
        state.tile_capacity = cap
    state.flags = _parse_status(data.get("status", []))
    for name, value in _mapping(data, "gprs").items():
        number = gpr_number(name, f"gprs.{name}")
        _expect(number != 0, f"gprs.{name}", "GPR0 (zero) always reads as zero")
        state.write_gpr(number, _word(value, f"gprs.{name}", 64))
    for pe_key, hands in _mapping(data, "tiles").items():
        pes = _pes_of_key(pe_key)
        _expect(isinstance(hands, dict), f"tiles.{pe_key}", "expected an object of hands")
        for hand, entries in hands.items():
            key = f"tiles.{pe_key}.{hand}"
            _expect(hand in HANDS, key, f"expected a hand, one of {list(HANDS)}")
            _expect(isinstance(entries, list) and len(entries) <= 16, key,
                    "expected a list of at most 16 tiles (null leaves a register free)")
            for n, spec in enumerate(entries):
                if spec is None:
                    continue
                index = HANDS.index(hand) * 16 + n
                for pe in pes:
                    _expect(state.tile(pe, index) is None, f"{key}[{n}]",
                            f"PE{pe} {hand}#{n + 1} is configured twice")
                    state.set_tile(pe, index, parse_tile(spec, f"{key}[{n}]"))
    for sid_key, spec in _mapping(data, "shared").items():
        match = re.fullmatch(r"S(\d+)", sid_key)
        _expect(match is not None and int(match.group(1)) < 256, f"shared.{sid_key}",
                "expected a Shared register name S0..S255")
        state.shared[int(match.group(1))] = parse_shared(spec, f"shared.{sid_key}")
    _expect(state.capacity_in_use() <= state.tile_capacity, "tiles",
            f"the tiles use {state.capacity_in_use()} B, more than the core tile capacity "
            f"{state.tile_capacity} B")
    program = _parse_program(data, base)
    try:
        assemble(program)
    except AsmError as exc:
        key = "program_file" if "program_file" in data else "program"
        raise ScenarioError(key, f"does not assemble: line {exc.line}, column {exc.column}: "
                                 f"{exc.message}") from exc
    path = None if path is None else pathlib.Path(path)
    return Scenario(str(data.get("name", path.stem if path else "scenario")),
                    str(data.get("description", "")), state, program, arithmetic, path)


# ---------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------

def _expect(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ScenarioError(key, message)


def _first(keys) -> str:
    return sorted(keys)[0] if keys else ""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(data: dict, key: str) -> dict:
    value = data.get(key, {})
    _expect(isinstance(value, dict), key, "expected a JSON object")
    return value


def _word(value, key: str, bits: int) -> int:
    """An integer or ``"0x.."`` string as an unsigned ``bits``-bit word (negatives wrap)."""
    if isinstance(value, str):
        try:
            value = int(value, 0)
        except ValueError:
            raise ScenarioError(key, f"expected an integer or a 0x-prefixed hex string, "
                                     f"got {value!r}") from None
    _expect(_is_int(value) and -(1 << (bits - 1)) <= value < (1 << bits), key,
            f"expected a {bits}-bit integer")
    return value & ((1 << bits) - 1)


def gpr_number(name: str, key: str = "gpr") -> int:
    """GPR number of an ABI name (``zero``, ``sp``, ``a0``..``x3``) or ``R0``..``R23``."""
    lowered = name.lower()
    if lowered in GPR_NAMES:
        return GPR_NAMES.index(lowered)
    match = re.fullmatch(r"r(\d+)", lowered)
    _expect(match is not None and int(match.group(1)) < len(GPR_NAMES), key,
            f"expected a GPR name ({', '.join(GPR_NAMES)}) or R0..R23")
    return int(match.group(1))


def _parse_status(value) -> int:
    _expect(isinstance(value, list) and all(v in StatusFlag.__members__ for v in value),
            "status", f"expected a list of flag names from {list(StatusFlag.__members__)}")
    flags = 0
    for name in value:
        flags |= StatusFlag[name]
    return flags


def _pes_of_key(key: str) -> tuple:
    if key == "all":
        return tuple(range(PE_COUNT))
    match = re.fullmatch(r"PE([0-3])", key)
    _expect(match is not None, f"tiles.{key}", "expected 'all' or PE0..PE3")
    return (int(match.group(1)),)


def _enum(value, table, key: str, what: str):
    names = [member.name for member in table]
    _expect(isinstance(value, str) and value in names, key,
            f"expected {what}, one of {', '.join(names)}")
    return table[value]


def _size(value, key: str, limit: int) -> int:
    if _is_int(value):
        size = value
    else:
        match = _SIZE.match(value) if isinstance(value, str) else None
        _expect(match is not None, key, "expected a size in bytes, e.g. 1024, \"256B\" or \"1KiB\"")
        size = int(match.group(1)) * (1024 if (match.group(2) or "").lower() == "kib" else 1)
    _expect(CELL_BYTES <= size <= limit and size % CELL_BYTES == 0, key,
            f"expected a whole number of 128-byte CELLs, 128..{limit} bytes")
    return size


def _element(item, key: str):
    """One data entry: ('raw', int) for a hex string, ('value', x), or None (undefined)."""
    if item is None:
        return None
    if isinstance(item, str):
        text = item.strip().lower()
        if text.startswith(("0x", "-0x")):
            return "raw", item
        specials = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
                    "-0": -0.0, "-0.0": -0.0}
        _expect(text in specials, key, "expected a number, a 0x-prefixed raw bit pattern, "
                                       "\"nan\", \"inf\", \"-inf\", \"-0\" or null")
        return "value", specials[text]
    _expect(isinstance(item, (int, float)) and not isinstance(item, bool), key,
            "expected a number, a 0x-prefixed raw bit pattern or null")
    return "value", item


def _contents(spec: dict, key: str, dtype: DataType):
    """``(raw uint64[rows, cols], defined bool[rows, cols])`` from ``data`` or
    ``shape`` + ``fill``."""
    if "data" in spec:
        _expect("shape" not in spec and "fill" not in spec, key,
                "give either 'data' or 'shape' with 'fill', not both")
        rows = spec["data"]
        _expect(isinstance(rows, list) and rows and all(isinstance(r, list) for r in rows)
                and rows[0] and all(len(r) == len(rows[0]) for r in rows), f"{key}.data",
                "expected a non-empty list of equally long rows")
        cells = [[_element(item, f"{key}.data[{r}][{c}]") for c, item in enumerate(row)]
                 for r, row in enumerate(rows)]
    else:
        shape = spec.get("shape")
        _expect(isinstance(shape, list) and len(shape) == 2 and all(_is_int(v) and v >= 1
                                                                    for v in shape),
                f"{key}.shape", "expected [rows, cols] of positive integers (or give 'data')")
        _expect("fill" in spec, f"{key}.fill", "expected a fill element with 'shape'")
        fill = _element(spec["fill"], f"{key}.fill")
        cells = [[fill] * shape[1] for _ in range(shape[0])]
    shape = (len(cells), len(cells[0]))
    raw = np.zeros(shape, dtype=np.uint64)
    defined = np.array([[c is not None for c in row] for row in cells], dtype=bool)
    values = [(r, c, x[1]) for r, row in enumerate(cells) for c, x in enumerate(row)
              if x is not None and x[0] == "value"]
    if values:
        try:
            encoded = encode_exact(dtype, np.array([v for *_, v in values], dtype=object))
        except (ValueError, TypeError) as exc:
            raise ScenarioError(f"{key}.data", f"not exact {dtype.name} values: {exc}") from exc
        for (r, c, _), bits in zip(values, encoded):
            raw[r, c] = int(bits)
    for r, row in enumerate(cells):
        for c, x in enumerate(row):
            if x is not None and x[0] == "raw":
                raw[r, c] = _word(x[1], f"{key}.data[{r}][{c}]", dtype.bits)
    return raw, defined


def _default_tsize(layout: Layout, dtype: DataType, shape, cols: int | None) -> int:
    """The smallest power-of-two TSize (a B.IOT SizeCode size) that holds the tile."""
    if layout.is_cube:
        need = cube_geometry(layout, dtype, *shape).required_bytes
    else:
        phys = cols or 1 << max(shape[1] - 1, 0).bit_length()
        need = shape[0] * phys * dtype.bits // 8
    size = CELL_BYTES
    while size < need:
        size *= 2
    return size


def parse_tile(spec, key: str, shared: bool = False) -> Tile:
    """A Local (or Shared) tile from its scenario description."""
    allowed = _SHARED_KEYS if shared else _TILE_KEYS
    _expect(isinstance(spec, dict), key, "expected a tile object (or null for a free register)")
    unknown = set(spec) - allowed
    _expect(not unknown, f"{key}.{_first(unknown)}",
            f"unknown key; expected one of {sorted(allowed)}")
    _expect("dtype" in spec, f"{key}.dtype", "expected the tile's DataType")
    dtype = _enum(spec["dtype"], DataType, f"{key}.dtype", "a DataType")
    layout = _enum(spec.get("layout", "ROW_MAJOR"), Layout, f"{key}.layout", "a layout")
    _expect(not (shared and layout is not Layout.ROW_MAJOR), f"{key}.layout",
            "expected ROW_MAJOR: Shared tiles are never CUBE")
    raw, defined = _contents(spec, key, dtype)
    cols = spec.get("cols")
    if cols is not None:
        _expect(_is_int(cols) and cols >= raw.shape[1] and not layout.is_cube, f"{key}.cols",
                "expected a row-major tile's physical column count, at least its data width")
    limit = SHARED_MAX_CAPACITY_BYTES if shared else LOCAL_MAX_CAPACITY_BYTES
    try:
        tsize = (_size(spec["tsize"], f"{key}.tsize", limit) if "tsize" in spec
                 else _default_tsize(layout, dtype, raw.shape, cols))
    except PTOFault as fault:
        raise ScenarioError(f"{key}.layout", fault.reason) from fault
    location = None
    if "location" in spec:
        by_name = {loc.value.lower(): loc for loc in Location}
        value = spec["location"]
        _expect(isinstance(value, str) and value.lower() in by_name, f"{key}.location",
                "expected \"Matrix\" or \"Any\"")
        location = by_name[value.lower()]
    feature_map = None
    if "feature_map" in spec:
        try:
            feature_map = FeatureMapDescriptor.from_dict(spec["feature_map"])
        except (ValueError, TypeError, AttributeError) as exc:
            raise ScenarioError(f"{key}.feature_map", f"expected a feature-map descriptor: {exc}") \
                from exc
    try:
        return Tile.from_raw(dtype, layout, raw, tsize, location, cols, defined, feature_map,
                             max_capacity=limit)
    except ValueError as exc:
        raise ScenarioError(key, str(exc)) from exc


def parse_shared(spec, key: str) -> SharedTile:
    """A Shared register from its scenario description."""
    tile = parse_tile(spec, key, shared=True)
    masks = {}
    for name in ("allocation_mask", "initialized_mask"):
        value = spec.get(name, "1111")
        _expect(isinstance(value, str) and re.fullmatch(r"[01]{4}", value) is not None,
                f"{key}.{name}", "expected four binary digits, PE0 first (e.g. \"1111\")")
        masks[name] = int(value, 2)
    published = spec.get("published", True)
    _expect(isinstance(published, bool), f"{key}.published", "expected true or false")
    return SharedTile(tile, masks["allocation_mask"], masks["initialized_mask"], published)


def _parse_program(data: dict, base) -> str:
    has_text, has_file = "program" in data, "program_file" in data
    _expect(has_text != has_file, "program", "expected exactly one of 'program' (assembly "
                                             "text or a list of lines) and 'program_file'")
    if has_file:
        name = data["program_file"]
        _expect(isinstance(name, str), "program_file", "expected a path to a .s file")
        path = pathlib.Path(base or ".") / name
        try:
            return path.read_text()
        except OSError as exc:
            raise ScenarioError("program_file", f"cannot read {path}: {exc.strerror}") from exc
    program = data["program"]
    if isinstance(program, list):
        _expect(all(isinstance(line, str) for line in program), "program",
                "expected a list of assembly lines (strings)")
        return "\n".join(program) + "\n"
    _expect(isinstance(program, str), "program", "expected assembly text or a list of lines")
    return program
