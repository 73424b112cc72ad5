"""The path estimator (``ptocube synth --paths``, :mod:`ptocube.build.paths`)."""

import argparse
import json

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ptocube.build import cli
from ptocube.build.paths import DelayModel, analyse, launching_signal, part_of, unit_paths

MODEL = DelayModel()


class _Netlist:
    """A hand-made flat yosys JSON netlist: cells by name, nets as integers."""

    def __init__(self):
        self.cells, self.names, self.ports = {}, {}, {}

    def cell(self, name, kind, inputs=(), outputs=(), **parameters):
        ports = {**{p: "input" for p, _ in inputs}, **{p: "output" for p, _ in outputs}}
        self.cells[name] = {"type": kind, "parameters": parameters, "port_directions": ports,
                            "connections": {p: list(bits) for p, bits in (*inputs, *outputs)}}

    def ff(self, name, d, q):
        self.cell(f"{name}_TRELLIS_FF_Q", "TRELLIS_FF", [("DI", [d]), ("CLK", [1])],
                  [("Q", [q])])
        self.names[name] = [q]

    def lut(self, name, inputs, z):
        self.cell(name, "LUT4", [(p, [b]) for p, b in zip("ABCD", inputs)], [("Z", [z])])

    def json(self):
        netnames = {n: {"bits": bits, "hide_name": 0} for n, bits in self.names.items()}
        return {"modules": {"top": {"attributes": {"top": "1"}, "ports": self.ports,
                                    "cells": self.cells, "netnames": netnames}}}


def test_a_path_is_its_launch_cells_hops_and_setup():
    n = _Netlist()
    n.ff("core.a", d=10, q=11)
    n.lut("l1", [11], 12)
    n.lut("l2", [12, 11], 13)
    n.ff("core.deep.b", d=13, q=10)
    report = analyse(n.json(), budget_ns=3.0)
    expected = MODEL.ff_out + 2 * (MODEL.route + MODEL.lut) + MODEL.route + MODEL.ff_data
    assert report.worst.ns == pytest.approx(expected, abs=0.01)
    assert report.worst.signal == "core.deep.b" and report.worst.part == "core.deep"
    assert report.worst.start == "core.a" and report.worst.levels == 2
    # core.a's input comes straight from core.b: one hop, under the budget.
    assert report.endpoints == 2 and report.over == 1
    assert [p.part for p in report.parts] == ["core.deep"]
    assert analyse(n.json(), budget_ns=10.0).over == 0


def test_carry_chains_and_slice_muxes_skip_the_routing_hop():
    n = _Netlist()
    n.ff("x", d=30, q=20)
    n.cell("c0", "CCU2C", [("A0", [20]), ("CIN", [0])], [("COUT", [21]), ("S0", [22])])
    n.cell("c1", "CCU2C", [("CIN", [21])], [("S1", [23]), ("COUT", [24])])
    n.lut("lut", [23], 25)
    n.cell("mux", "PFUMX", [("ALUT", [25]), ("BLUT", [20]), ("C0", [20])], [("Z", [26])])
    n.ff("y", d=26, q=30)
    report = analyse(n.json(), trace="y")
    into_chain = MODEL.ff_out + MODEL.route + MODEL.carry_in
    expected = (into_chain + MODEL.carry_sum + MODEL.route + MODEL.lut + MODEL.mux
                + MODEL.route + MODEL.ff_data)
    assert report.traced.ns == pytest.approx(expected, abs=0.01)
    assert report.traced.levels == 4


def test_block_ram_outputs_launch_late_unless_registered():
    def one(regmode):
        n = _Netlist()
        n.cell("mem.0.0", "DP16KD", [("ADA0", [40])], [("DOA0", [41])], REGMODE_A=regmode)
        n.ff("q", d=41, q=40)
        return analyse(n.json(), trace="q").traced.ns
    assert one("NOREG") - one("OUTREG") == pytest.approx(MODEL.bram_out - MODEL.bram_outreg)


def test_memory_inputs_are_endpoints_of_their_component():
    n = _Netlist()
    n.ff("store.addr", d=50, q=50)
    n.lut("l", [50], 51)
    n.cell("store.payload3.0.5", "DP16KD", [("ADB7", [51]), ("DIA3", [50])], [])
    report = analyse(n.json(), budget_ns=0.5)
    # The register and both memory inputs are over; the memory's address input is the worst.
    assert report.over == 3 and [p.part for p in report.parts] == ["store"]
    assert report.parts[0].worst.signal == "store.payload3:ADB"
    assert part_of("store.payload3:ADB", depth=1) == "store"


def test_long_paths_are_grouped_by_their_launching_signal(tmp_path, capsys):
    n = _Netlist()
    # Two bits of ``ctl.sel`` each start two LUT levels into a register of their own; one
    # bit of ``ctl.go`` starts one level: over 3 ns, ``ctl.sel`` launches two endpoints.
    for k in range(2):
        n.cell(f"ctl.sel_TRELLIS_FF_Q_{k}", "TRELLIS_FF", [("DI", [2]), ("CLK", [1])],
               [("Q", [20 + k])])
    n.names["ctl.sel"] = [20, 21]
    n.ff("ctl.go", d=2, q=22)
    for k, start in enumerate((20, 21)):
        n.lut(f"x{k}", [start], 30 + k)
        n.lut(f"y{k}", [30 + k], 40 + k)
        n.ff(f"data.r{k}", d=40 + k, q=50 + k)
    n.lut("z", [22], 60)
    n.ff("data.s", d=60, q=61)
    report = analyse(n.json(), budget_ns=3.0, fanout=0)
    assert [(s.start, s.over) for s in report.starts] == [("ctl.sel", 2)]
    two_levels = MODEL.ff_out + 2 * (MODEL.route + MODEL.lut) + MODEL.route + MODEL.ff_data
    assert report.starts[0].worst.ns == pytest.approx(two_levels, abs=0.01)
    assert [s.start for s in analyse(n.json(), budget_ns=1.5).starts] == ["ctl.sel", "ctl.go"]
    path = tmp_path / "top.json"
    path.write_text(json.dumps(n.json()))
    assert _cli("--paths", "--netlist", str(path), "--freq", "333") == 0
    assert "where they begin (1 launching signals)" in capsys.readouterr().out
    assert _cli("--paths", "--netlist", str(path), "--freq", "333", "--json") == 0
    assert json.loads(capsys.readouterr().out)["starts"][0]["over"] == 2


def test_a_launching_signal_drops_bit_indices_and_cell_suffixes():
    assert launching_signal("unit.panels.f_is_b") == "unit.panels.f_is_b"
    assert launching_signal("unit.store.rd_data[17]") == "unit.store.rd_data"
    assert launching_signal("unit.fill.i_TRELLIS_FF_Q_1") == "unit.fill.i"
    assert launching_signal("unit.decoder.pending_LUT4_Z[2]") == "unit.decoder.pending"


def test_a_combinational_loop_ends_the_walk():
    n = _Netlist()
    n.lut("a", [61, 70], 60)
    n.lut("b", [60], 61)
    n.ff("r", d=61, q=70)
    report = analyse(n.json())
    assert report.endpoints == 1 and report.worst.ns < 10


def test_wide_nets_are_those_logic_drives_to_many_sinks(tmp_path, capsys):
    n = _Netlist()
    n.ff("ctl.a", d=80, q=81)
    n.lut("ctl.enable_LUT4_Z", [81], 82)
    n.names["ctl.enable"] = [82]
    for i in range(70):     # the LUT's output enables 70 flip-flops, ``ctl.a`` feeds 71 sinks
        n.cell(f"wide.r{i}_TRELLIS_FF_Q", "TRELLIS_FF",
               [("DI", [81]), ("CE", [82]), ("CLK", [1])], [("Q", [100 + i])])
    report = analyse(n.json(), fanout=64)
    assert [(w.net, w.sinks, w.driver) for w in report.wide] == [("ctl.enable", 70, "LUT4")]
    assert report.wide[0].ns == pytest.approx(MODEL.ff_out + MODEL.route + MODEL.lut)
    assert analyse(n.json(), fanout=71).wide == [] and analyse(n.json(), fanout=0).wide == []
    path = tmp_path / "top.json"
    path.write_text(json.dumps(n.json()))
    assert _cli("--paths", "--netlist", str(path), "--fanout", "32") == 0
    assert "1 nets driven by logic with >= 32 sinks" in capsys.readouterr().out
    assert _cli("--paths", "--netlist", str(path), "--json") == 0
    assert json.loads(capsys.readouterr().out)["wide"][0]["sinks"] == 70


class _Compare(wiring.Component):
    """A sum compared against a limit; ``staged`` registers the sum first."""

    def __init__(self, staged):
        self.staged = staged
        super().__init__({"a": In(32), "b": In(32), "hit": Out(1)})

    def elaborate(self, platform):
        m = Module()
        a = Signal(32)
        b = Signal(32)
        m.d.sync += [a.eq(self.a), b.eq(self.b)]
        total = Signal(33)
        if self.staged:
            m.d.sync += total.eq(a + b)
        else:
            m.d.comb += total.eq(a + b)
        hit = Signal()
        m.d.sync += hit.eq(total > 1_000_000)
        m.d.comb += self.hit.eq(hit)
        return m


def test_a_pipeline_register_shortens_the_synthesized_path(tmp_path):
    flat = unit_paths(_Compare(staged=False), tmp_path / "flat", budget_ns=5.0, trace="hit")
    staged = unit_paths(_Compare(staged=True), tmp_path / "staged", budget_ns=5.0, trace="hit")
    assert flat.traced.start.startswith(("a", "b")) and staged.traced.start.startswith("total")
    assert staged.traced.ns < flat.traced.ns
    assert json.loads((tmp_path / "flat" / "paths.json").read_text())["worst"]["ns"] \
        == flat.worst.ns


def _cli(*argv):
    parser = argparse.ArgumentParser()
    cli.add_synth_arguments(parser)
    return cli.run_synth(parser.parse_args(list(argv)))


def test_cli_paths_of_a_netlist(tmp_path, capsys):
    n = _Netlist()
    n.ff("unit.store.a", d=10, q=11)
    n.lut("l1", [11], 12)
    n.ff("unit.img2col.b", d=12, q=10)
    path = tmp_path / "top.json"
    path.write_text(json.dumps(n.json()))
    assert _cli("--paths", "--netlist", str(path), "--freq", "500",
                "--trace", "img2col") == 0
    shown = capsys.readouterr().out
    assert "over 2 ns (500 MHz)" in shown and "unit.img2col: unit.store.a -> unit.img2col.b" \
        in shown and "worst path into unit.img2col.b" in shown
    assert _cli("--paths", "--netlist", str(path), "--json") == 0
    assert json.loads(capsys.readouterr().out)["over"] == 0
    assert _cli("--paths", "--family", "ice40") == 2
    assert _cli("--paths", "--netlist", str(tmp_path / "none.json")) == 2


def test_bench_rows_summarize_each_preset(monkeypatch):
    from ptocube.build import paths
    n = _Netlist()
    n.ff("store.a", d=10, q=11)
    n.lut("l1", [11], 12)
    n.lut("l2", [12], 13)
    n.ff("cube.feed.b", d=13, q=10)
    report = analyse(n.json(), budget_ns=4.0, depth=2)
    asked = []

    def fake(name, *, depth):
        asked.append((name, depth))
        return report
    monkeypatch.setattr(paths, "preset_paths", fake)
    rows = paths.bench_paths(("ecp5-int8",))
    assert asked == [("ecp5-int8", 2)]
    assert rows[0]["part"] == "(unit)" and rows[0]["over_10ns"] == 1
    assert rows[0]["path"] == "store.a -> cube.feed.b"
    assert [(r["part"], r["levels"]) for r in rows[1:]] == [("cube.feed", 2)]


def test_cli_paths_synthesizes_the_preset_design(monkeypatch, tmp_path, capsys):
    from ptocube.build import paths
    n = _Netlist()
    n.ff("decoder.a", d=10, q=10)
    asked = {}

    def fake(design, out, **kwargs):
        design._MustUse__silence = True      # not synthesized here
        asked.update(kwargs, design=type(design).__name__, out=out)
        return analyse(n.json(), budget_ns=kwargs["budget_ns"])
    monkeypatch.setattr(paths, "unit_paths", fake)
    assert _cli("--paths", "--preset", "ecp5-int8", "--design", "decoder", "--freq", "50",
                "--out", str(tmp_path)) == 0
    assert asked["design"] == "BundleDecoder" and asked["out"] == tmp_path
    assert asked["budget_ns"] == 20.0
    assert "preset ecp5-int8, design decoder" in capsys.readouterr().out
