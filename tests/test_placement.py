"""The placement report (``ptocube synth --placed``, :mod:`ptocube.build.placement`)."""

import argparse
import json

import pytest

from ptocube.build import cli
from ptocube.build.placement import analyse, congestion
from ptocube.build.pnr import synthesize, DEVICES

ECP5 = DEVICES["LFE5U-85F-6BG381"]


class _Placed:
    """A hand-made netlist as nextpnr writes it after placement: cells with their site."""

    def __init__(self):
        self.cells, self.names = {}, {}

    def cell(self, name, kind, x, y, inputs=(), outputs=()):
        ports = {**{p: "input" for p, _ in inputs}, **{p: "output" for p, _ in outputs}}
        self.cells[name] = {"type": kind, "attributes": {"NEXTPNR_BEL": f"X{x}/Y{y}/SLICEA"},
                            "port_directions": ports,
                            "connections": {p: list(b) for p, b in (*inputs, *outputs)}}

    def net(self, name, *bits):
        self.names[name] = list(bits)

    def json(self):
        netnames = {n: {"bits": b, "hide_name": int(n.startswith("$"))}
                    for n, b in self.names.items()}
        return {"modules": {"top": {"attributes": {"top": "1"}, "cells": self.cells,
                                    "netnames": netnames}}}


def _design():
    """A 3-bit register at (0, 0) reaching (70, 5); a block RAM address net of two bits; a
    constant net across the device; a knot of short nets of one component at (40, 40)."""
    p = _Placed()
    for i in range(3):
        p.cell(f"core.reg_TRELLIS_FF_Q_{i}", "TRELLIS_FF", 0, 0, outputs=[("Q", [10 + i])])
        p.cell(f"far.lut{i}", "LUT4", 70, 5 - i, inputs=[("A", [10 + i])])
        p.cell(f"near.lut{i}", "LUT4", 1, 0, inputs=[("A", [10 + i])])
    p.net("core.reg", 10, 11, 12)
    for i in range(2):
        p.cell(f"mem.addr_lut{i}", "LUT4", 0, 60, outputs=[("Z", [20 + i])])
        p.net(f"store.payload0.0.3_ADB{i + 3}", 20 + i)
    p.cell("mem.ram.0.3_DP16KD", "DP16KD", 65, 60, inputs=[("ADB3", [20]), ("ADB4", [21])])
    p.cell("$PACKER_VCC", "VCC", 0, 90, outputs=[("Z", [30])])
    p.cell("sink_far", "LUT4", 99, 0, inputs=[("B", [30])])
    p.net("$PACKER_VCC_NET", 30)
    for i in range(40):
        p.cell(f"knot.src{i}", "TRELLIS_FF", 40, 40, outputs=[("Q", [100 + i])])
        p.cell(f"knot.dst{i}", "LUT4", 43, 43, inputs=[("A", [100 + i])])
        p.net(f"busy.knot.w{i}", 100 + i)
    return p.json()


def test_far_nets_are_grouped_by_register_and_ranked_by_distance():
    report = analyse(_design(), far=60, window=8)
    assert report.cells == 3 * 3 + 2 + 1 + 2 + 80
    # Every driven net with a placed sink, less the packer's constant.
    assert report.nets == 3 + 2 + 40
    # Half-perimeters: 75, 74, 73 for the register's bits (driver (0, 0), sinks up to
    # (70, 5 - i) and (1, 0)), 65 for each RAM address bit, 6 for each knot net.
    assert report.wirelength == 75 + 74 + 73 + 2 * 65 + 40 * 6
    first, second = report.signals
    # The register's three bits are one signal; the farthest sink of bit 0 is 70 + 5 tiles.
    assert (first.signal, first.tiles, first.bits, first.sinks, first.driver) == \
        ("core.reg", 75, 3, 2, "TRELLIS_FF")
    # A block RAM's port nets are grouped by memory and port, bit and block numbers dropped.
    assert (second.signal, second.tiles, second.bits) == ("store.payload0:ADB", 65, 2)
    assert report.far_nets == 5
    assert report.histogram == {0: 40, 60: 5}
    assert [s.signal for s in analyse(_design(), far=74).signals] == ["core.reg"]


def test_the_densest_window_names_the_components_that_load_it():
    report = analyse(_design(), far=60, window=8)
    w = report.window
    assert w["size"] == 8 and w["x"] <= 40 and w["x"] + 7 >= 43
    assert w["y"] <= 40 and w["y"] + 7 >= 43 and w["demand"] > w["mean"]
    (part, share), = report.parts
    assert part == "busy.knot" and share == pytest.approx(1.0)
    data = report.to_json()
    assert data["far_nets"] == 5 and data["signals"][0]["signal"] == "core.reg"
    assert data["parts"] == [{"part": "busy.knot", "share": 1.0}]
    table = report.table(rows=1)
    assert "5 nets reach 60 tiles or more" in table and "core.reg" in table
    assert "store.payload0:ADB" not in table and "1 more signals" in table
    assert "busy.knot" in table


def test_an_unplaced_netlist_is_refused():
    netlist = _design()
    for cell in netlist["modules"]["top"]["cells"].values():
        del cell["attributes"]["NEXTPNR_BEL"]
    with pytest.raises(ValueError, match="--no-route --write"):
        analyse(netlist)


def test_router2_congestion_by_component_and_signal():
    text = ("store.cmd[0],5\nstore.cmd[1],4\nstore.payload0.0.3_ADB7,2\n"
            "cube.result.buf_valid_TRELLIS_FF_Q_DI,3\n\nnot a line\n")
    report = congestion(text, depth=1, name="h_congestion_by_net_42.csv")
    assert (report.iteration, report.overuse, report.nets) == (42, 14, 4)
    assert report.parts == [("store", 11), ("cube", 3)]
    assert report.signals == [("store.cmd", 9), ("cube.result.buf_valid", 3),
                              ("store.payload0:ADB", 2)]
    assert congestion(text).iteration is None
    assert congestion(text).parts[0] == ("store", 9)
    table = report.table(rows=1)
    assert "at iteration 42: 14 on 4 nets" in table and "store.cmd" in table
    assert "cube.result" not in table
    assert report.to_json()["signals"][0] == {"signal": "store.cmd", "overuse": 9}


def _synth(*argv):
    parser = argparse.ArgumentParser()
    cli.add_synth_arguments(parser)
    return cli.run_synth(parser.parse_args(list(argv)))


def test_cli_reads_a_placed_netlist(tmp_path, capsys):
    path = tmp_path / "placed.json"
    path.write_text(json.dumps(_design()))
    assert _synth("--placed", str(path), "--far", "70") == 0
    out = capsys.readouterr().out
    assert "3 nets reach 70 tiles or more" in out and "core.reg" in out
    assert _synth("--placed", str(path), "--json") == 0
    assert json.loads(capsys.readouterr().out)["far_nets"] == 5
    assert _synth("--placed", str(tmp_path / "none.json")) == 2
    assert "no netlist" in capsys.readouterr().err
    unplaced = _design()
    for cell in unplaced["modules"]["top"]["cells"].values():
        cell["attributes"] = {}
    path.write_text(json.dumps(unplaced))
    assert _synth("--placed", str(path)) == 2
    assert "give --board" in capsys.readouterr().err


def test_cli_places_a_synthesized_netlist_first(tmp_path, capsys):
    # The real tools: a counter whose top bit drives a register at the far side is placed
    # by nextpnr-ecp5 without routing, and the report reads nextpnr's placed netlist.
    src = tmp_path / "count.v"
    src.write_text("module top(input clk, output reg q); reg [11:0] c; "
                   "always @(posedge clk) begin c <= c + 1; q <= c[11]; end endmodule\n")
    synthesize(src, ECP5, tmp_path)
    assert _synth("--placed", str(tmp_path / "top.json"), "--board", "ulx3s-85f",
                  "--seed", "3", "--far", "0", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    placed = tmp_path / "placed-seed3.json"
    assert placed.is_file() and (tmp_path / "placed-seed3.log").is_file()
    # 13 flip-flops and the counter's carry chain, all placed; every net measured.
    assert report["cells"] >= 13 and report["nets"] >= 13
    assert report["far_nets"] == report["nets"]
    assert any(s["signal"].startswith("c") for s in report["signals"])
