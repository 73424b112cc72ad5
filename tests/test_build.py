"""The FPGA flow: synthesis + place and route figures, board bitstreams, the command line.

Default tests use designs that route in seconds; whole-unit and ECP5 preset builds are
``slow`` (``make regress``).
"""

import argparse
import json

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ptocube.build import cli, selftest
from ptocube.build.boards import BOARDS, board
from ptocube.build.selftest import STATUS_MASK, SelfTest
from ptocube.build.pnr import DEVICES, Device, PinLightWrapper, ToolError, place_and_route
from test_selftest import GprUnit, gpr_program

ICE40 = DEVICES["iCE40UP5K-SG48"]
ECP5 = DEVICES["LFE5U-85F-6BG381"]


class Counter(wiring.Component):
    """A 24-bit counter with an enable: carry chain, FFs, one clock."""
    en: In(1)
    q: Out(8)

    def elaborate(self, platform):
        m = Module()
        count = Signal(24)
        with m.If(self.en):
            m.d.sync += count.eq(count + 1)
        m.d.comb += self.q.eq(count[16:])
        return m


class Multipliers(wiring.Component):
    """``n`` registered 16 x 16 products: one DSP each."""

    def __init__(self, n):
        self.n = n
        super().__init__({"a": In(16 * n), "b": In(16 * n), "p": Out(32 * n)})

    def elaborate(self, platform):
        m = Module()
        for k in range(self.n):
            m.d.sync += self.p[32 * k:32 * (k + 1)].eq(
                self.a[16 * k:16 * (k + 1)] * self.b[16 * k:16 * (k + 1)])
        return m


@pytest.mark.parametrize("device", [ICE40, ECP5], ids=["ice40", "ecp5"])
def test_counter_figures(device, tmp_path):
    r = place_and_route(Counter(), device, freq_mhz=50, workdir=tmp_path)
    assert r.ff == 24 and r.dsp == 0 and r.bram == 0
    assert r.carry > 0 and r.lut4 > 0
    used, available = r.utilization["logic"]
    assert 0 < used < available and r.fits
    assert len(r.fmax) == 1 and r.timing_met and r.min_fmax > 50
    assert (tmp_path / "top.report.json").exists()
    data = json.loads(json.dumps(r.to_json()))
    assert data["utilization"]["ff"]["used"] == 24
    assert 0 < data["utilization"]["logic"]["share"] < 0.01


def test_missed_constraint_is_reported_not_raised():
    r = place_and_route(Counter(), ICE40, freq_mhz=1000)
    assert not r.timing_met and r.min_fmax < 1000
    assert "NOT met" in r.table()


def test_dsp_count_wrapper_and_overflow():
    # 96 input and 64 output pins, more than the 39 I/O of the UP5K's SG48 package: the
    # pin-light wrapper leaves clk, rst, din and dout.
    r = place_and_route(Multipliers(2), ICE40, freq_mhz=12, wrap=True)
    assert r.dsp == 2 and r.utilization["dsp"] == (2, 8)
    assert r.utilization["io"][0] <= 18
    # Nine DSPs on a part with eight: nextpnr refuses, the error says why.
    with pytest.raises(ToolError, match="nextpnr-ice40 failed"):
        place_and_route(Multipliers(9), ICE40, freq_mhz=12, wrap=True)


def test_bad_arguments():
    with pytest.raises(ValueError, match="family"):
        Device("gowin", "x", "y")
    with pytest.raises(ValueError, match="unknown board"):
        board("de0")
    with pytest.raises(ValueError, match="freq_mhz"):
        place_and_route(Counter(), ICE40, freq_mhz=0)
    with pytest.raises(FileNotFoundError):
        place_and_route("/nonexistent/top.v", ICE40, freq_mhz=12)
    with pytest.raises(ValueError, match="unknown design"):
        cli.design("gpu", None)
    with pytest.raises(TypeError):
        PinLightWrapper(Module())


def test_verilog_file_input(tmp_path):
    src = tmp_path / "blink.v"
    src.write_text("module top(input clk, output reg q); reg [20:0] c; "
                   "always @(posedge clk) begin c <= c + 1; q <= c[20]; end endmodule\n")
    r = place_and_route(src, ECP5, freq_mhz=100)
    assert r.ff == 22 and r.timing_met


@pytest.mark.parametrize("name", ["icebreaker",
                                  pytest.param("ulx3s-85f", marks=pytest.mark.slow),
                                  pytest.param("ecpix5-85", marks=pytest.mark.slow)])
def test_selftest_board_flow(name, tmp_path, capsys, monkeypatch):
    # `ptocube build`: the board top, SelfTest, its player and UART through the whole bitstream
    # flow, with the GPR-file stand-in unit (the real unit's builds are the slow tests below).
    def stand_in(config, *, clk_hz, baud):
        return SelfTest(GprUnit(), gpr_program(), clk_hz=clk_hz, baud=baud,
                        status_mask=STATUS_MASK)
    monkeypatch.setattr(selftest, "unit_selftest", stand_in)
    brd = board(name)
    assert _cli("build", "--board", name, "--out", str(tmp_path)) == 0
    assert f"{tmp_path / brd.bitstream}" in capsys.readouterr().out
    assert (tmp_path / brd.bitstream).stat().st_size > 100_000
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["board"] == name and summary["timing_met"]
    (achieved, constraint), = [(v["achieved_mhz"], v["constraint_mhz"])
                               for v in summary["fmax"].values()]
    assert constraint == pytest.approx(brd.clock_hz / 1e6, rel=1e-4) and achieved >= constraint


def _cli(command, *argv):
    parser = argparse.ArgumentParser()
    getattr(cli, f"add_{command}_arguments")(parser)
    return getattr(cli, f"run_{command}")(parser.parse_args(list(argv)))


def test_cli_synth_table_and_json(tmp_path, capsys):
    assert _cli("synth", "--board", "icebreaker", "--design", "systolic",
                "--out", str(tmp_path)) == 0
    table = capsys.readouterr().out
    assert "ice40-tiny" in table and "DSP" in table and "Fmax" in table
    report = json.loads((tmp_path / "synth-ice40-tiny-systolic.json").read_text())
    assert report["dsp"] == 4                        # 2 x 2 integer PEs, one DSP each
    assert report["fmax"] and all(v["achieved_mhz"] >= 12 for v in report["fmax"].values())


def test_cli_verilog(tmp_path):
    out = tmp_path / "dec.v"
    assert _cli("verilog", "--preset", "ice40-tiny", "--design", "decoder", "--name", "dec",
                "-o", str(out)) == 0
    assert "module dec(" in out.read_text()


def test_boards_known():
    assert set(BOARDS) == {"icebreaker", "ulx3s-85f", "ecpix5-85"}
    for brd in BOARDS.values():
        plat = brd.platform()
        assert brd.device.family == ("ice40" if "iCE40" in plat.device else "ecp5")
        assert brd.clock_hz in (12e6, 25e6, 100e6)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_cli_build_unit_selftest(name, tmp_path, capsys):
    # The board's default preset: the whole unit's self-test bitstream, meeting the board clock.
    assert _cli("build", "--board", name, "--out", str(tmp_path), "--router", "router2"
                if board(name).device.family == "ecp5" else "router1") == 0
    assert (tmp_path / board(name).bitstream).stat().st_size > 100_000
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["timing_met"] and "Fmax" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("preset_name", ["ecp5-int8", "ecp5-full"])
def test_ecp5_presets_fit(preset_name, tmp_path):
    assert _cli("synth", "--board", "ulx3s-85f", "--preset", preset_name, "--freq", "100",
                "--router", "router2", "--out", str(tmp_path)) == 0
    report = json.loads((tmp_path / f"synth-{preset_name}-unit.json").read_text())
    assert all(v["used"] <= v["available"] for v in report["utilization"].values())
