"""Scenario files, ``ptocube run`` and the examples.

Every example in ``examples/`` is run, and its result is checked against an
independent computation made here from the scenario's own JSON (read with
``json``, encoded with the reference encoder, computed with the reference
arithmetic of ``model_helpers``).
"""

import json
import math
import pathlib
from fractions import Fraction

import numpy as np
import pytest

from ptocube.model.scenario import ScenarioError, load_scenario, parse_scenario
from ptocube.model.state import Location, StatusFlag
from ptocube.sim.cli import main
from ptocube.sim.run import EngineUnavailable, format_table, run_scenario

from model_helpers import ref_accumulate, ref_encode, ref_img2col, sel

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    return json.loads((EXAMPLES / name).read_text())


def _raw(spec):
    """Raw bit patterns of a scenario tile, computed here (None entries stay None)."""
    if "data" in spec:
        rows = spec["data"]
    else:
        rows = [[spec["fill"]] * spec["shape"][1] for _ in range(spec["shape"][0])]
    def one(v):
        if v is None:
            return None
        if isinstance(v, str) and v.lower().startswith("0x"):
            return int(v, 16)
        return ref_encode(spec["dtype"], -0.0 if v == "-0" else v)
    return [[one(v) for v in row] for row in rows]


def _data(result, bundle=0, pe=0, role=0):
    tiles = [t for t in result["bundles"][bundle]["published"] if t["pe"] == pe]
    return [[int(v, 16) for v in row] for row in tiles[role]["data"]]


def _as_hex_width(result, bundle=0, role=0):
    return len(result["bundles"][bundle]["published"][role]["data"][0][0]) - 2


# ---------------------------------------------------------------------------
# The examples
# ---------------------------------------------------------------------------

def test_example_int8_matmul():
    doc = _load("int8-matmul.json")
    result = run_scenario(EXAMPLES / "int8-matmul.json")
    b = np.array(_raw(doc["tiles"]["all"]["N"][0]), dtype=np.int64)
    b = np.where(b > 127, b - 256, b)
    assert sorted(t["pe"] for t in result["bundles"][0]["published"]) == [0, 1]
    for pe in (0, 1):
        a = np.array(_raw(doc["tiles"][f"PE{pe}"]["M"][0]), dtype=np.int64)
        a = np.where(a > 127, a - 256, a)
        assert _data(result, pe=pe) == ((a @ b) & 0xFFFFFFFF).tolist()
    assert result["bundles"][0]["published"][0]["dtype"] == "S32"
    assert _as_hex_width(result) == 8


def test_example_fp16_matmul_acc():
    doc = _load("fp16-matmul-acc.json")
    tiles = doc["tiles"]["all"]
    result = run_scenario(EXAMPLES / "fp16-matmul-acc.json")
    expected = ref_accumulate("FP16", "FP16", _raw(tiles["M"][0]), _raw(tiles["N"][0]),
                              c_raw=_raw(tiles["U"][0]))
    for pe in range(4):
        assert _data(result, pe=pe) == expected.tolist()
    assert result["bundles"][0]["published"][0]["selector"] == "U#2"


def test_example_tgemv_bias():
    doc = _load("tgemv-bias.json")
    tiles = doc["tiles"]["all"]
    result = run_scenario(EXAMPLES / "tgemv-bias.json")
    expected = ref_accumulate("U8", "U8", _raw(tiles["M"][0]), _raw(tiles["N"][0]),
                              bias_raw=_raw(tiles["T"][0])[0])
    assert _data(result) == expected.tolist()
    assert _data(result)[0][4] == (sum(range(1, 16)) + 255) * 3 - 1     # wrapped bias


def test_example_mx_matmul():
    doc = _load("mx-matmul.json")
    tiles = doc["tiles"]["all"]
    result = run_scenario(EXAMPLES / "mx-matmul.json")
    expected = ref_accumulate("E4M3", "E5M2", _raw(tiles["M"][0]), _raw(tiles["N"][0]),
                              a_scale=_raw(tiles["T"][0]), b_scale=_raw(tiles["T"][1]),
                              bias_raw=_raw(tiles["T"][2])[0])
    assert _data(result) == expected.tolist()


def _req8(p: int, scale: Fraction, offset: int):
    """ReLU, then REQ8 with RNE, the S9 clamp, the offset and a saturating S8 encode."""
    x = Fraction(max(p, 0)) * scale
    t = round(x)                              # Python rounds halves to even
    flags = StatusFlag.NX if t != x else 0
    if not -256 <= t <= 255:
        t, flags = max(-256, min(255, t)), StatusFlag.OF | StatusFlag.NX
    r = t + offset
    if not -128 <= r <= 127:
        r, flags = max(-128, min(127, r)), StatusFlag.OF | StatusFlag.NX
    return r & 0xFF, flags


def test_example_quantize_rowmax():
    doc = _load("quantize-rowmax.json")
    tiles = doc["tiles"]["all"]
    word = int(doc["gprs"]["a0"], 16)
    scale_bits = word & 0xFFFFE000
    scale = Fraction(float(np.array([scale_bits], np.uint32).view(np.float32)[0]))
    offset = (word >> 37) & 0x1FF
    offset = offset - 512 if offset >> 8 else offset
    assert (scale, offset) == (Fraction(1, 4), 3)
    a = np.array(_raw(tiles["M"][0]), dtype=np.int64)
    b = np.array(_raw(tiles["N"][0]), dtype=np.int64)
    a, b = np.where(a > 127, a - 256, a), np.where(b > 127, b - 256, b)
    p = a @ b
    d, flags = [], 0
    for row in p.tolist():
        out = []
        for v in row:
            q, f = _req8(v, scale, offset)
            out.append(q)
            flags |= f
        d.append(out)
    result = run_scenario(EXAMPLES / "quantize-rowmax.json")
    assert _data(result) == d
    assert _data(result, role=1) == [[int(v) & 0xFFFFFFFF] for v in p.max(axis=1)]
    assert _data(result, role=2) == [[int(v) & 0xFFFFFFFF for v in (r[:8].max(), r[8:].max())]
                                     for r in p]
    assert result["bundles"][0]["flags"] == StatusFlag.names(flags)
    assert result["status"]["flags"] == StatusFlag.names(flags)


def test_example_img2col_padding():
    doc = _load("img2col-padding.json")
    spec = doc["tiles"]["all"]["M"][0]
    flat = [v for row in _raw(spec) for v in row]
    expected = ref_img2col(flat, spec["feature_map"], 0, 0, 4, 8, 8)
    result = run_scenario(EXAMPLES / "img2col-padding.json")
    assert _data(result) == expected.tolist()
    # The spec digest's worked example 2, transcribed.
    assert _data(result)[3] == [12, 238, 13, 238, 22, 238, 23, 238]
    t = result["bundles"][0]["published"][0]
    assert (t["layout"], t["location"], t["selector"]) == ("ROW_MAJOR", "Matrix", "M#2")


def test_example_tgemv_acc_chain():
    doc = _load("tgemv-acc-chain.json")
    tiles = doc["tiles"]["all"]
    result = run_scenario(EXAMPLES / "tgemv-acc-chain.json")
    y1 = ref_accumulate("BF16", "BF16", _raw(tiles["M"][0]), _raw(tiles["N"][0]),
                        c_raw=_raw(tiles["T"][3]))
    y2 = ref_accumulate("BF16", "BF16", _raw(tiles["M"][1]), _raw(tiles["N"][1]), c_raw=y1)
    first, second, third = result["bundles"]
    assert _data(result, 0) == y1.tolist() and first["published"][0]["selector"] == "T#1"
    assert _data(result, 1) == y2.tolist() and second["published"][0]["selector"] == "M#3"
    assert (third["outcome"], third["fault"], third["fault_index"]) == \
        ("fault", "Fault_TileLegality", 18)
    assert "published" not in third


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_every_example_runs_and_prints(path):
    result = run_scenario(path)
    assert result["engine"] == "model" and result["bundles"]
    table = format_table(result)
    assert result["scenario"] in table and "status:" in table


# ---------------------------------------------------------------------------
# ptocube run
# ---------------------------------------------------------------------------

def test_cli_json_output(capsys):
    assert main(["run", str(EXAMPLES / "tgemv-bias.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bundles"][0]["operation"] == "BSTART.TGEMV.BIAS"
    t = out["bundles"][0]["published"][0]
    assert (t["pe"], t["hand"], t["n"], t["dtype"], t["layout"], t["shape"]) == \
        (0, "U", 1, "U32", "CUBE_M16", [1, 8])
    assert out["status"] == {"flags": [], "value": "0x00"}


def test_cli_table_output(capsys):
    assert main(["run", str(EXAMPLES / "tgemv-acc-chain.json")]) == 0
    out = capsys.readouterr().out
    assert "Fault_TileLegality @18" in out and "PE0,1,2,3 M#3 FP32 CUBE_M16 1x4" in out


def test_unknown_engine_is_rejected(capsys):
    with pytest.raises(EngineUnavailable, match="unknown engine 'bogus'"):
        run_scenario(EXAMPLES / "tgemv-bias.json", "bogus")
    with pytest.raises(SystemExit):
        main(["run", str(EXAMPLES / "tgemv-bias.json"), "--engine", "bogus"])
    assert "invalid choice" in capsys.readouterr().err


def test_cli_reports_a_malformed_scenario(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tiles": {"all": {"M": [{"dtype": "FP61", "data": [[1]]}]}},
                               "program": "BSTOP"}))
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "tiles.all.M[0].dtype" in err and "DataType" in err


# ---------------------------------------------------------------------------
# The scenario format
# ---------------------------------------------------------------------------

def _tile(**kw):
    spec = {"dtype": "U8", "layout": "ROW_MAJOR", "data": [[1, 2]]}
    spec.update(kw)
    return spec


def _scenario(**kw):
    doc = {"tiles": {"all": {"M": [_tile()]}}, "program": "BSTOP"}
    doc.update(kw)
    return doc


@pytest.mark.parametrize("doc, key, fragment", [
    ([1, 2], "", "JSON object"),
    (_scenario(bogus=1), "bogus", "unknown key"),
    (_scenario(arithmetic="exact"), "arithmetic", "pto-v0"),
    (_scenario(tiles={"PE7": {}}), "tiles.PE7", "PE0..PE3"),
    (_scenario(tiles={"all": {"X": []}}), "tiles.all.X", "hand"),
    (_scenario(tiles={"all": {"M": [_tile(dtype="FP61")]}}), "tiles.all.M[0].dtype", "DataType"),
    (_scenario(tiles={"all": {"M": [_tile(layout="NZ2")]}}), "tiles.all.M[0].layout", "layout"),
    (_scenario(tiles={"all": {"M": [_tile(data=[[1], [1, 2]])]}}), "tiles.all.M[0].data",
     "equally long"),
    (_scenario(tiles={"all": {"M": [_tile(data=[[300]])]}}), "tiles.all.M[0].data", "U8"),
    (_scenario(tiles={"all": {"M": [_tile(dtype="FP16", data=[[0.1]])]}}), "tiles.all.M[0].data",
     "not exact"),
    (_scenario(tiles={"all": {"M": [_tile(data=[["0x1ff"]])]}}), "tiles.all.M[0].data[0][0]",
     "8-bit"),
    (_scenario(tiles={"all": {"M": [_tile(data=[[True]])]}}), "tiles.all.M[0].data[0][0]",
     "number"),
    (_scenario(tiles={"all": {"M": [_tile(tsize=100)]}}), "tiles.all.M[0].tsize", "128"),
    (_scenario(tiles={"all": {"M": [_tile(tsize="2MiB")]}}), "tiles.all.M[0].tsize", "size"),
    (_scenario(tiles={"all": {"M": [_tile(cols=1)]}}), "tiles.all.M[0].cols", "column"),
    (_scenario(tiles={"all": {"M": [_tile(location="Cube")]}}), "tiles.all.M[0].location",
     "Matrix"),
    (_scenario(tiles={"all": {"M": [_tile(shape=[2, 2])]}}), "tiles.all.M[0]", "either"),
    (_scenario(tiles={"all": {"M": [{"dtype": "U8", "shape": [2, 0], "fill": 1}]}}),
     "tiles.all.M[0].shape", "positive"),
    (_scenario(tiles={"all": {"M": [_tile(layout="CUBE_M16", data=[[1]] * 17)]}}),
     "tiles.all.M[0].layout", "16 rows"),
    (_scenario(tiles={"all": {"M": [_tile(feature_map={"hieght": 3})]}}),
     "tiles.all.M[0].feature_map", "hieght"),
    (_scenario(tiles={"all": {"M": [_tile()]}, "PE1": {"M": [_tile()]}}), "tiles.PE1.M[0]",
     "twice"),
    (_scenario(shared={"S300": _tile()}), "shared.S300", "S0..S255"),
    (_scenario(shared={"S3": _tile(layout="CUBE_N8")}), "shared.S3.layout", "ROW_MAJOR"),
    (_scenario(shared={"S3": _tile(allocation_mask="11")}), "shared.S3.allocation_mask",
     "binary"),
    (_scenario(gprs={"b7": 1}), "gprs.b7", "GPR name"),
    (_scenario(gprs={"zero": 1}), "gprs.zero", "GPR0"),
    (_scenario(gprs={"a0": "twelve"}), "gprs.a0", "integer"),
    (_scenario(status=["XX"]), "status", "flag names"),
    (_scenario(tile_capacity=100), "tile_capacity", "128"),
    (_scenario(tile_capacity=128), "tiles", "core tile capacity"),
    ({"tiles": {}}, "program", "exactly one"),
    (_scenario(program_file="x.s"), "program", "exactly one"),
    (_scenario(program=["BSTOP", 3]), "program", "lines"),
])
def test_malformed_scenarios_name_the_key(doc, key, fragment):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc)
    assert fragment in str(info.value)
    assert info.value.key == key


def test_scenario_files_and_program_files(tmp_path):
    (tmp_path / "prog.s").write_text("BSTOP\n")
    doc = _scenario(program_file="prog.s")
    del doc["program"]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    scenario = load_scenario(path)
    assert scenario.program == "BSTOP\n" and scenario.name == "s"
    path.write_text("{not json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_scenario(path)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.json")
    doc["program_file"] = "nowhere.s"
    path.write_text(json.dumps(doc))
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(path)


def test_program_that_does_not_assemble_is_a_scenario_error():
    with pytest.raises(ScenarioError, match="does not assemble: line 2") as info:
        parse_scenario(_scenario(program="BSTOP\nBSTART.TMATMUL FP99\n"))
    assert info.value.key == "program"


def test_scenario_builds_the_state_it_describes():
    scenario = parse_scenario({
        "name": "x", "arithmetic": "pto-v0", "status": ["NV", "NX"], "tile_capacity": 131072,
        "gprs": {"a0": "0x10", "R5": -1, "x3": 7},
        "tiles": {"all": {"T": [None, _tile(dtype="FP16", layout="CUBE_M16",
                                            data=[[1.5, "0x3c00", None, "-inf"]])]},
                  "PE3": {"N": [_tile(location="Matrix", cols=4, tsize="1KiB")]}},
        "shared": {"S9": _tile(dtype="U16", initialized_mask="0011", published=False)},
        "program": ["BSTOP"]})
    state = scenario.state
    assert scenario.arithmetic == "pto-v0" and scenario.program == "BSTOP\n"
    assert state.flags == StatusFlag.NV | StatusFlag.NX and state.tile_capacity == 131072
    assert (state.read_gpr(2), state.read_gpr(5), state.read_gpr(23)) == (16, 2**64 - 1, 7)
    t = state.tile(1, sel("T#2"))
    assert state.tile(1, sel("T#1")) is None
    assert t.raw().tolist()[0][:2] == [0x3E00, 0x3C00] and t.raw()[0, 3] == 0xFC00
    assert t.defined_valid().tolist() == [[True, True, False, True]]
    n = state.tile(3, sel("N#1"))
    assert state.tile(2, sel("N#1")) is None
    assert (n.location, n.phys_cols, n.capacity, n.rows) == (Location.MATRIX, 4, 1024, 256)
    shared = state.shared[9]
    assert (shared.initialized_mask, shared.published) == (0b0011, False)
    assert not shared.cooperatively_ready()


def test_demo_passes_on_the_model_and_the_simulated_hardware(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "verdict: PASS (6 of 6" in out and "hardware matches the model bit for bit" in out
    assert out.count("exact, hw = model") == 6
    assert "TIMG2COL" in out and "BSTART.TMATMULMX" in out and "BSTART.TGEMV.ACC" in out


def test_demo_model_only(capsys):
    assert main(["demo", "--model-only"]) == 0
    out = capsys.readouterr().out
    assert "verdict: PASS (6 of 6 bundles match an exact numpy computation)" in out
    assert out.count("  exact\n") == 6


def test_nan_and_signed_zero_values():
    scenario = parse_scenario(_scenario(tiles={"all": {"M": [_tile(
        dtype="FP32", data=[["nan", "-0", "inf", math.inf, -0.0]])]}}))
    raw = scenario.state.tile(0, sel("M#1")).raw()[0].tolist()
    assert raw == [0x7FC00000, 0x80000000, 0x7F800000, 0x7F800000, 0x80000000]


def test_running_a_scenario_leaves_its_initial_state_untouched():
    scenario = load_scenario(EXAMPLES / "tgemv-acc-chain.json")
    before = scenario.state.snapshot()
    first, second = run_scenario(scenario), run_scenario(scenario)
    assert first == second and scenario.state.same_as(before)
