"""The shared foundation: DataType table, operation table, fault names, packaging."""

import importlib.util
import pathlib
import sysconfig

import pytest

from ptocube.model.bundle import Operation, PEMODE_OF_MASK, pe_mask_of_pemode, hand_of_selector
from ptocube.model.datatype import (DataType, NumClass, RESERVED_CODES, MX_MATRIX_TYPES,
                                    MX_SCALED_TYPES, ORDINARY_MATRIX_TYPES, accumulator_type)
from ptocube.model.faults import FaultClass, PTOFault


def test_datatype_codes_cover_the_five_bit_field():
    # Every 5-bit code is either a DataType or reserved, never both.
    for code in range(32):
        assert (code in DataType._value2member_map_) != (code in RESERVED_CODES)


@pytest.mark.parametrize("dtype,bits,cls", [
    (DataType.FP64, 64, NumClass.FLOAT), (DataType.HF32, 32, NumClass.FLOAT),
    (DataType.E3M2, 8, NumClass.FLOAT), (DataType.E2M1X2, 4, NumClass.FLOAT),
    (DataType.E8M0, 8, NumClass.FLOAT), (DataType.S4X2, 4, NumClass.SIGNED),
    (DataType.S32, 32, NumClass.SIGNED), (DataType.U4X2, 4, NumClass.UNSIGNED),
    (DataType.U64, 64, NumClass.UNSIGNED),
])
def test_datatype_width_and_class(dtype, bits, cls):
    assert dtype.bits == bits
    assert dtype.num_class is cls
    assert dtype.packed == (bits == 4)


def test_matrix_type_sets():
    assert MX_SCALED_TYPES < MX_MATRIX_TYPES
    assert DataType.HiF4X2 not in MX_MATRIX_TYPES | ORDINARY_MATRIX_TYPES
    assert not {DataType.S32, DataType.U32, DataType.E8M0} & ORDINARY_MATRIX_TYPES
    assert accumulator_type(DataType.E2M1X2) is DataType.FP32
    assert accumulator_type(DataType.S4X2) is DataType.S32
    assert accumulator_type(DataType.U16) is DataType.U32


def test_operation_predicates_match_the_function_numbers():
    assert {op.value for op in Operation if op.uses_bias} == {1, 5, 17, 21}
    assert {op.value for op in Operation if op.uses_acc} == {2, 6, 18, 22}
    assert {op.value for op in Operation if op.is_mx} == {4, 5, 6, 20, 21, 22}
    assert {op.value for op in Operation if op.is_gemv} == {16, 17, 18, 20, 21, 22}
    assert Operation.TGEMV_MX_ACC.mnemonic == "BSTART.TGEMVMX.ACC"
    assert Operation.TMATMUL_BIAS.mnemonic == "BSTART.TMATMUL.BIAS"


def test_pe_masks_and_selectors():
    assert [pe_mask_of_pemode(m) for m in range(8)] == [0, 8, 4, 2, 1, 12, 14, 15]
    assert all(pe_mask_of_pemode(PEMODE_OF_MASK[mask]) == mask for mask in PEMODE_OF_MASK)
    assert hand_of_selector(0) == (0, 1)        # T#1
    assert hand_of_selector(33) == (2, 2)       # M#2
    assert hand_of_selector(63) == (3, 16)      # N#16


def test_fault_names_round_trip():
    for fault in FaultClass:
        assert FaultClass.from_spec_name(fault.spec_name) is fault
    err = PTOFault(FaultClass.TILE_LEGALITY, "C/D index rule")
    assert "Fault_TileLegality" in str(err)
    with pytest.raises(ValueError):
        FaultClass.from_spec_name("Fault_Bogus")


def test_no_generic_top_level_packages_are_installed():
    # The card's folders are installed only as ptocube.* subpackages.
    for name in ("model", "hdl", "sim", "build"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            assert pathlib.Path(sysconfig.get_paths()["purelib"]) not in pathlib.Path(spec.origin).parents
    for sub in ("model", "hdl", "sim", "build"):
        assert importlib.util.find_spec(f"ptocube.{sub}") is not None


def test_no_merge_conflict_markers_in_the_tree():
    # A merge that left its markers in a page passes every other test (session 18's did).
    root = pathlib.Path(__file__).resolve().parents[1]
    markers = ("<<<<<<< ", ">>>>>>> ")
    found = []
    for folder in ("docs", "hdl", "model", "sim", "build", "tests", "examples", ".ci"):
        for path in (root / folder).rglob("*"):
            if path.is_file() and path.suffix in (".md", ".py", ".json", ".txt", "") \
                    and "out" not in path.relative_to(root).parts:
                text = path.read_text(errors="replace")
                found += [f"{path.relative_to(root)}:{n}" for n, line in
                          enumerate(text.splitlines(), 1) if line.startswith(markers)]
    found += [f"{name}:{n}" for name in ("README.md", "Makefile", "pyproject.toml")
              for n, line in enumerate((root / name).read_text().splitlines(), 1)
              if line.startswith(markers)]
    assert not found, found
