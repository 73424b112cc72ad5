"""The simulated CubeUnit against the golden model, scenario by scenario.

Most cases share one simulation (:func:`ptocube.sim.hw_run.run_scenarios_hw` frees every
register between scenarios), because building the simulator costs several seconds.  Each
scenario's architectural result (outcomes, fault classes and indices, published tiles word for
word, per-bundle and sticky flags) must equal ``ptocube run --engine model``'s.
"""

import json
import pathlib
import random

import pytest
from amaranth.back import verilog

from ptocube.hdl.config import PRESETS, CubeConfig
from ptocube.hdl.host import HostCommand, HostOp, StatusOutcome, split_parts
from ptocube.hdl.img2col import FEATURE_MAP_DESCRIPTOR
from ptocube.hdl.tile_desc import encode_tile
from ptocube.hdl.top import CubeUnit
from ptocube.model.datatype import DataType
from ptocube.model.faults import FaultClass
from ptocube.model.layout import Layout
from ptocube.model.scenario import load_scenario, parse_scenario
from ptocube.model.img2col import FeatureMapDescriptor
from ptocube.model.machine import Machine
from ptocube.model.state import Location, State, Tile, pes_of_mask
from ptocube.sim.host import clear_state, load_state, read_tile
from ptocube.sim.hw_run import (HardwareUnavailable, SimUnit, architectural, program_beats,
                                run_one, run_scenarios_hw)
from ptocube.sim.run import run_scenario

from img2col_scenarios import random_img2col
from model_helpers import img2col_bundle

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
#: The simulated build.
CONFIG = PRESETS["sim-small"]


def _example_source():
    spec = json.loads((EXAMPLES / "img2col-padding.json").read_text())
    return spec["tiles"]["all"]["M"][0]


def _scenario(name, program, tiles=None, **keys):
    spec = {"name": name, "tiles": tiles or {"all": {"M": [_example_source()]}},
            "program": program}
    spec.update(keys)
    return parse_scenario(spec)


def _i2c(**kw):
    kw.setdefault("destination", ("M", "128B"))
    return img2col_bundle("U8", kw.pop("cols", 8), kw.pop("rows", 4), **kw)


def _directed():
    return [
        load_scenario(EXAMPLES / "img2col-padding.json"),
        # The published output is a valid Matrix row-major tile but has no feature map.
        _scenario("chain", _i2c() + _i2c(source="M#2")),
        # A malformed bundle in the middle faults alone; the next bundle still runs.
        _scenario("malformed-middle", _i2c() + "B.DIM zero, 8, ->LB0\nBSTOP\n"
                  + _i2c(mask="1100")),
        _scenario("noop-then-one-pe", _i2c(mask="0000") + _i2c(mask="0010")),
        _scenario("core-capacity", _i2c(), tile_capacity=4 * 128),
        _scenario("window-range", _i2c(ior="a0, zero"), gprs={"a0": 1}),
        # A completion-time fault of a bundle that a start ended: that start opens nothing
        # (the decoder's squash, model D29), so the second bundle vanishes; the third runs.
        _scenario("squash", _i2c(ior="a0, zero").replace("BSTOP\n", "") + _i2c()
                  + _i2c(mask="1000"), gprs={"a0": 1}),
        _scenario("sticky-status-kept", _i2c(destination=("N", "256B")), status=["NV", "NX"]),
        # The source reads an undefined element (PE2 only).
        _scenario("undefined-on-one-pe", _i2c(), tiles={
            "PE0": {"M": [_example_source()]}, "PE1": {"M": [_example_source()]},
            "PE3": {"M": [_example_source()]},
            "PE2": {"M": [dict(_example_source(), data=[[1, 99, 2, 99, None, 99, 11, 99],
                                                        [12, 99, 13, 99, 21, 99, 22, 99],
                                                        [23, 99, 0, 0, 0, 0, 0, 0]])]}}),
        # The shared engine takes each PE's own source and feature map (decision T10).
        _scenario("per-pe-sources", _i2c(), tiles={
            f"PE{pe}": {"M": [_with_fm(data=[[v + 40 * pe for v in row] for row in DATA_3X8],
                                       **fm)]}
            for pe, fm in enumerate([{}, {"stride_height": 1, "stride_width": 1},
                                     {"padding": 0x155, "dilation_width": 2, "pad_right": 1},
                                     {"pad_bottom": 1, "pad_right": 1, "logical_channels": 2}])}),
        # PE3's window is out of range: its job runs after PE0..PE2 committed theirs, and
        # the whole group is dropped; the next bundle (PE3 left out) publishes.
        _scenario("fault-on-last-pe", _i2c() + _i2c(mask="1110"), tiles={
            "PE0": {"M": [_example_source()]}, "PE1": {"M": [_example_source()]},
            "PE2": {"M": [_example_source()]},
            "PE3": {"M": [_with_fm(filter_width=1)]}}),
    ]


#: Source data of the example's shape (3 x 8 U8, all defined).
DATA_3X8 = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16],
            [17, 18, 19, 20, 21, 22, 23, 24]]


def _with_fm(data=None, **fm):
    """The example's source tile with some feature-map fields (and the data) replaced."""
    source = _example_source()
    return dict(source, data=data or source["data"],
                feature_map=dict(source["feature_map"], **fm))


MATRIX_EXAMPLES = ["int8-matmul", "tgemv-bias", "fp16-matmul-acc", "tgemv-acc-chain",
                   "quantize-rowmax", "mx-matmul"]
RANDOM_IMG2COL = 10


@pytest.fixture(scope="module")
def runs():
    """(scenario, hardware result) for the directed and random TIMG2COL scenarios and the
    Matrix examples, all on one simulated unit."""
    rng = random.Random(8)
    scenarios = (_directed() + [random_img2col(rng, k) for k in range(RANDOM_IMG2COL)]
                 + [load_scenario(EXAMPLES / f"{name}.json") for name in MATRIX_EXAMPLES])
    return list(zip(scenarios, run_scenarios_hw(scenarios, CONFIG, cube=True)))


def _check(scenario, result):
    assert not isinstance(result, Exception), result
    expected = run_scenario(scenario)
    assert architectural(result) == architectural(expected), scenario.name
    assert all(b["cycles"] > 0 for b in result["bundles"])


def test_example_img2col_matches_model(runs):
    scenario, result = runs[0]
    _check(scenario, result)
    assert result["bundles"][0]["outcome"] == "success"
    assert len(result["bundles"][0]["published"]) == 4


@pytest.mark.parametrize("k", range(1, len(_directed())))
def test_directed_img2col_matches_model(runs, k):
    _check(*runs[k])


def test_malformed_bundle_faults_alone(runs):
    scenario, result = runs[2]
    outcomes = [b["outcome"] for b in result["bundles"]]
    assert outcomes == ["success", "fault", "success"]
    assert result["bundles"][1]["fault"] == "Fault_BundleControl"
    assert {t["pe"] for t in result["bundles"][2]["published"]} == {0, 1}


def test_random_img2col_matches_model(runs):
    outcomes = set()
    start = len(_directed())
    for scenario, result in runs[start:start + RANDOM_IMG2COL]:
        _check(scenario, result)
        outcomes |= {b.get("fault", b["outcome"]) for b in result["bundles"]}
    # The random cases reach success and faults (not only one of them).
    assert "success" in outcomes and "Fault_TileLegality" in outcomes


#: A 1x1-filter view of 8 x 8 elements: a published 4 x 8 U8 tile defines the first 32.
FM_8X8 = FeatureMapDescriptor(height=8, width=8, logical_channels=1)
#: Rows 0..31 of its im2col matrix (all defined), then rows 0..32 (element 32 is not).
REUSE_PROGRAM = (img2col_bundle("U8", 1, 32, 1, source="M#2", destination=("T", "128B"),
                                mask="1000")
                 + img2col_bundle("U8", 1, 33, 1, source="M#2", destination=("T", "128B"),
                                  mask="1000"))


def test_fragmentation_faults_with_tile_allocation():
    """Decision T4: a destination that fits the PE's free bytes but no free run of CELLs
    faults with Fault_TileAllocation and leaves the state as it was; a smaller one fits.
    Then a scenario whose tile is larger than the build's memory is reported as not fitting."""
    config = CubeConfig(tile_bytes_per_pe=4096, shared_bytes=1024)      # 32 CELLs per PE
    state = _scenario("frag", "BSTOP").state
    su = SimUnit(config, cube=False)
    out = {}
    fill = [("T", 8 * 128), ("U", 128), ("T", 8 * 128), ("U", 128), ("N", 14 * 128 - 128)]
    fm_parts = split_parts(FEATURE_MAP_DESCRIPTOR.encode(FM_8X8), 6)

    async def main(ctx):
        await su.setup(ctx)
        await su.drive(ctx, load_state(state, config))                # M#1: CELL 0
        # T#1 (index 0) has held a feature map before the reuse program publishes it: the
        # stale parts stay in the memory, and the new register reads none (decision T20).
        tile = Tile.from_raw(DataType.S8, Layout.ROW_MAJOR, [[1]], 128)
        for part, word in enumerate(split_parts(encode_tile(tile), 2)):
            await su.transact(ctx, HostCommand(HostOp.DESC_PART, addr=part, data=word))
        assert (await su.transact(ctx, HostCommand(HostOp.CONFIGURE, 0, 0))).ok
        for part in range(6):
            stale = HostCommand(HostOp.WRITE_FM, 0, 0, part, 2**64 - 1)
            assert (await su.transact(ctx, stale)).ok
        assert (await su.transact(ctx, HostCommand(HostOp.FREE, 0, 0))).ok
        bases = []
        for k, (hand, size) in enumerate(fill):
            index = "TUMN".index(hand) * 16 + k
            tile = Tile.from_raw(DataType.S8, Layout.ROW_MAJOR, [[1]], size)
            for part, word in enumerate(split_parts(encode_tile(tile), 2)):
                await su.transact(ctx, HostCommand(HostOp.DESC_PART, addr=part, data=word))
            bases.append((await su.transact(ctx, HostCommand(HostOp.CONFIGURE, 0, index))).data)
        out["bases"] = bases
        for k in (0, 2):                                                 # two 8-CELL holes
            index = "TUMN".index(fill[k][0]) * 16 + k
            assert (await su.transact(ctx, HostCommand(HostOp.FREE, 0, index))).ok
        start = len(su.statuses)
        program = (_i2c(mask="1000", destination=("M", "2KiB"))
                   + _i2c(mask="1000", destination=("M", "1KiB")))
        await su.send_beats(ctx, program_beats(program))
        await su.drain(ctx)
        out["statuses"] = su.statuses[start:]
        out["tile"] = await su.drive(ctx, read_tile(0, 33))
        out["flags"] = (await su.transact(ctx, HostCommand(HostOp.READ_FLAGS, 0, 33))).data
        # The published output becomes a TIMG2COL source (its flags are implicit, T5).
        for part, word in enumerate(fm_parts):
            assert (await su.transact(ctx, HostCommand(HostOp.WRITE_FM, 0, 33, part, word))).ok
        start = len(su.statuses)
        await su.send_beats(ctx, program_beats(REUSE_PROGRAM))
        await su.drain(ctx)
        out["reuse"] = su.statuses[start:]
        out["reuse_tile"] = await su.drive(ctx, read_tile(0, 0))
        out["reuse_fm"] = [(await su.transact(ctx, HostCommand(HostOp.READ_FM, 0, 0, a))).data
                           for a in range(6)]
        out["source_fm"] = [(await su.transact(ctx, HostCommand(HostOp.READ_FM, 0, 33, a))).data
                            for a in range(6)]
        await su.drive(ctx, clear_state(state))
        big = dict(_example_source(), tsize=8192)
        too_big = _scenario("too-big", _i2c(), tiles={"all": {"M": [big]}})
        out["too_big"] = await run_one(ctx, su, too_big, skip_zero=False)

    su.run(main)
    assert out["bases"] == [1, 9, 10, 18, 19]
    first, second = out["statuses"]
    assert first.outcome is StatusOutcome.FAULT
    assert first.fault is FaultClass.TILE_ALLOCATION
    assert second.outcome is StatusOutcome.SUCCESS and second.outputs == (33,)
    assert out["tile"]["tsize"] == 1024 and out["tile"]["shape"] == [4, 8]
    assert out["flags"] == 2**32 - 1                    # 4 x 8 valid elements, 8 columns
    # The model, given the published tile with the same feature map, agrees.
    raw = [[int(v, 16) for v in row] for row in out["tile"]["data"]]
    source = Tile.from_raw(DataType.U8, Layout.ROW_MAJOR, raw, 1024, phys_cols=8,
                           location=Location.MATRIX, feature_map=FM_8X8)
    model_state = State()
    model_state.set_tile(0, 33, source)
    expected = Machine(model_state).run(REUSE_PROGRAM)
    assert [r.outcome for r in expected] == [s.outcome.name.lower() for s in out["reuse"]]
    assert [r.fault for r in expected] == [s.fault for s in out["reuse"]]
    assert expected[0].published[0].tile.raw().tolist() == [
        [int(v, 16) for v in row] for row in out["reuse_tile"]["data"]]
    assert out["reuse_fm"] == [0] * 6 and out["source_fm"] == fm_parts and any(fm_parts)
    assert isinstance(out["too_big"], HardwareUnavailable)
    assert "does not fit the tile memory of this build (4096 B per PE" in str(out["too_big"])


def test_host_commands_wait_for_bundles(runs):
    """Decisions T3 and T25: a host offering commands back to back from the cycle a record
    appears gets none taken while a record is in the preflight, entering it, or executing;
    the one taken as the record appears makes the record wait; the results are unchanged."""
    scenario, plain = runs[0]
    su = SimUnit(CONFIG, cube=False)
    unit = su.unit
    pf, dec = unit.preflight, unit.decoder
    out = {"offer": False, "overlaps": 0, "raced": 0, "taken": 0, "stopped": False}

    async def monitor(ctx):
        async for _, _, *v in ctx.tick().sample(
                unit.host_cmd.valid, unit.host_cmd.ready, pf.busy, unit.phase,
                pf.record.valid, pf.record.ready, dec.o.valid):
            cmd_valid, cmd_ready, busy, phase, rec_valid, rec_ready, dec_valid = v
            if cmd_valid and cmd_ready:
                out["taken"] += 1
                out["overlaps"] += bool(busy or phase or (rec_valid and rec_ready))
                out["raced"] += bool(dec_valid)

    async def host(ctx):
        # The first command is offered in the cycle the decoder's record appears; the
        # others follow back to back until the bundle has its status.
        while not ctx.get(dec.o.valid):
            await ctx.tick()
        while out["offer"]:
            await su.transact(ctx, HostCommand(HostOp.READ_SYS, addr=0))
        out["stopped"] = True

    async def main(ctx):
        await su.setup(ctx)
        await su.drive(ctx, load_state(scenario.state, CONFIG))
        out["offer"] = True
        await su.send_beats(ctx, program_beats(scenario.program))
        while not su.statuses:
            await ctx.tick()
        out["offer"] = False
        while not out["stopped"]:
            await ctx.tick()
        await su.drain(ctx)
        status, = su.statuses
        out["status"] = status
        out["published"] = [await su.drive(ctx, read_tile(pe, index))
                            for pe in pes_of_mask(status.pe_mask) for index in status.outputs]

    su.sim.add_testbench(monitor, background=True)
    su.sim.add_testbench(host)
    su.run(main)
    assert out["overlaps"] == 0
    # The host was served in the cycle the record appeared, and again after the bundle.
    assert out["raced"] == 1 and out["taken"] > 2
    assert out["status"].outcome is StatusOutcome.SUCCESS
    assert out["published"] == plain["bundles"][0]["published"]


@pytest.mark.parametrize("k", range(len(MATRIX_EXAMPLES)))
def test_matrix_examples_match_model(runs, k):
    scenario, result = runs[-len(MATRIX_EXAMPLES) + k]
    assert scenario.name == MATRIX_EXAMPLES[k]
    _check(scenario, result)
    assert any(b["outcome"] == "success" for b in result["bundles"])


def test_fault_on_the_last_pe_drops_the_group(runs):
    scenario, result = next(r for r in runs if r[0].name == "fault-on-last-pe")
    first, second = result["bundles"]
    assert first["outcome"] == "fault" and not first.get("published")
    assert second["outcome"] == "success"
    assert {t["pe"] for t in second["published"]} == {0, 1, 2}


def test_squash_drops_the_bundle_a_faulting_start_opened(runs):
    scenario, result = next(r for r in runs if r[0].name == "squash")
    assert [b["outcome"] for b in result["bundles"]] == ["fault", "success"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_verilog_of_each_preset(name):
    text = verilog.convert(CubeUnit(PRESETS[name], cube=True), name="cube_unit")
    assert "module cube_unit" in text


@pytest.mark.slow
def test_cli_engine_sim_with_waveform(tmp_path, capsys):
    from ptocube.sim.cli import main
    vcd = tmp_path / "run.vcd"
    assert main(["run", str(EXAMPLES / "img2col-padding.json"), "--engine", "sim", "--json",
                 "--vcd", str(vcd)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["engine"] == "sim" and result["bundles"][0]["cycles"] > 0
    assert architectural(result) == architectural(
        run_scenario(EXAMPLES / "img2col-padding.json"))
    gtkw = vcd.with_suffix(".gtkw").read_text()
    assert vcd.stat().st_size > 0
    for group in ("host port", "parcels / status", "decoder", "preflight", "engines",
                  "tile store"):
        assert group in gtkw
