"""The ECP5 block RAMs' output registers (``build/outreg.py``): which registers after a read
port move into the DP16KD, on netlists from yosys and on hand-made ones for each refusal."""

import copy
import json

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ptocube.build import pnr
from ptocube.build.outreg import FABRIC_ATTRIBUTE, absorb_output_registers, correct_stat
from ptocube.build.pnr import DEVICES, place_and_route
from ptocube.hdl.logic import FABRIC_REGISTER, NO_COLLISION, BlockReadPort

ECP5 = DEVICES["LFE5U-85F-6BG381"]


class RamReads(wiring.Component):
    """Four block RAMs, each read into a 64-bit register loaded under ``take``:

    * ``wide``: a reset-less register, the case the pass takes (pseudo-dual-port, 36-bit
      words);
    * ``reset``: a register with a reset, which the RAM's output register cannot be;
    * ``shared``: a reset-less register whose RAM output also reaches a port directly;
    * ``fabric``: a reset-less register the design keeps in the fabric (``FABRIC_REGISTER``).
    """
    waddr: In(8)
    raddr: In(8)
    wdata: In(64)
    we: In(4)
    ren: In(1)
    take: In(1)
    wide: Out(64)
    reset: Out(64)
    shared: Out(64)
    fabric: Out(64)
    direct: Out(8)

    def elaborate(self, platform):
        m = Module()
        for k, name in enumerate(("wide", "reset", "shared", "fabric")):
            mem = Memory(shape=64, depth=256, init=[], attrs=NO_COLLISION)
            m.submodules[name] = mem
            wr, rd = mem.write_port(), BlockReadPort(m, mem, name)
            m.d.comb += [wr.addr.eq(self.waddr), wr.data.eq(self.wdata), wr.en.eq(self.we[k]),
                         rd.addr.eq(self.raddr), rd.en.eq(self.ren)]
            out = Signal(64, name=f"{name}_out", reset_less=name != "reset",
                         attrs=FABRIC_REGISTER if name == "fabric" else {})
            with m.If(self.take):
                m.d.sync += out.eq(rd.data)
            m.d.comb += getattr(self, name).eq(out)
            if name == "shared":
                m.d.comb += self.direct.eq(rd.data[::8])     # a bit of every RAM
        return m


def _by_memory(netlist):
    found = {}
    for name, cell in netlist["modules"]["top"]["cells"].items():
        if cell["type"] == "DP16KD":
            found.setdefault(name.split(".")[0].split("$")[0], []).append(cell)
    return found


def test_yosys_netlist_registers_move_into_the_ram(tmp_path):
    """synthesize() applies the pass on ECP5: only the ``wide`` RAMs take their register, with
    the register's enable as OCE, and the 64 flip-flops leave the netlist and its counts."""
    netlist = json.loads(pnr.synthesize(RamReads(), ECP5, tmp_path).read_text())
    rams = _by_memory(netlist)
    assert set(rams) == {"wide", "reset", "shared", "fabric"}
    cells = netlist["modules"]["top"]["cells"].values()
    ffs = [cell for cell in cells if cell["type"] == "TRELLIS_FF"]
    assert len(ffs) == 192           # ``reset``, ``shared``, ``fabric``: 64 each; ``wide``: none
    for name, group in rams.items():
        for ram in group:
            modes = {ram["parameters"][f"REGMODE_{p}"] for p in "AB"}
            assert modes == ({"OUTREG"} if name == "wide" else {"NOREG"}), name
    take = next(bits for n, bits in ((n, v["bits"]) for n, v in
                                     netlist["modules"]["top"]["netnames"].items())
                if n == "take")
    for ram in rams["wide"]:
        assert any(ram["connections"][f"OCE{p}"] == take for p in "AB")
    # The outputs are driven by the RAMs' data pins now.
    wide_bits = set(netlist["modules"]["top"]["ports"]["wide"]["bits"])
    driven = {bit for ram in rams["wide"] for pin, bits in ram["connections"].items()
              if pin.startswith("DO") for bit in bits}
    assert wide_bits <= driven
    stat = json.loads((tmp_path / "top.stat.json").read_text())
    assert stat["design"]["num_cells_by_type"]["TRELLIS_FF"] == 192
    log = (tmp_path / "top.outreg.log").read_text()
    assert log.startswith(f"{len(rams['wide'])} DP16KD read ports take their output register")


def test_transformed_netlist_places_and_routes(tmp_path):
    """nextpnr packs, places and routes the rewritten netlist (the output registers'
    parameters and OCE connections are ones it takes), and its FF count is yosys's less the
    moved registers."""
    r = place_and_route(RamReads(), ECP5, freq_mhz=50, workdir=tmp_path)
    assert r.fits and r.timing_met
    assert r.ff == 192 and r.utilization["ff"][0] == 192


# ---- hand-made netlists: one DP16KD, 18-bit port B read into flip-flops ---------------------

def _netlist(width=18, pdp=False):
    """A DP16KD whose port B reads ``width`` bits into reset-less flip-flops enabled by net 2,
    clock net 1; flip-flop k drives net 100 + k (a top-level output)."""
    conns = {"CLKA": [1], "CLKB": [1], "RSTA": ["0"], "RSTB": ["0"], "OCEA": ["1"],
             "OCEB": ["1"], "CEB": [3]}
    pins = ([f"DOB{i}" for i in range(18)] + [f"DOA{i}" for i in range(18)])[:width]
    cells = {}
    for k, pin in enumerate(pins):
        conns[pin] = [10 + k]
        cells[f"ff{k}"] = {
            "type": "TRELLIS_FF",
            "parameters": {"CEMUX": "CE", "CLKMUX": "CLK", "GSR": "DISABLED", "LSRMUX": "LSR",
                           "REGSET": "RESET", "SRMODE": "LSR_OVER_CE"},
            "port_directions": {"CLK": "input", "CE": "input", "DI": "input", "LSR": "input",
                                "Q": "output"},
            "connections": {"CLK": [1], "CE": [2], "DI": [10 + k], "LSR": ["0"],
                            "Q": [100 + k]}}
    wide = "00000000000000000000000000100100" if pdp else "00000000000000000000000000010010"
    cells["ram"] = {
        "type": "DP16KD",
        "parameters": {"CLKAMUX": "CLKA", "CLKBMUX": "CLKB", "DATA_WIDTH_A": wide,
                       "DATA_WIDTH_B": wide, "REGMODE_A": "NOREG", "REGMODE_B": "NOREG"},
        "port_directions": {**{p: "input" for p in conns if not p.startswith("DO")},
                            **{p: "output" for p in pins}},
        "connections": conns}
    return {"modules": {"top": {
        "attributes": {"top": "00000000000000000000000000000001"},
        "ports": {"q": {"direction": "output", "bits": [100 + k for k in range(width)]}},
        "cells": cells,
        "netnames": {"rd": {"bits": [10 + k for k in range(width)]},
                     "q": {"bits": [100 + k for k in range(width)]}}}}}


def _ram(netlist):
    return netlist["modules"]["top"]["cells"]["ram"]


def test_hand_made_port_b():
    net = _netlist()
    done = absorb_output_registers(net)
    ram = _ram(net)
    assert done.flip_flops == 18 and done.ports == {"ram": "B"}
    assert ram["parameters"]["REGMODE_B"] == "OUTREG" and ram["parameters"]["REGMODE_A"] == "NOREG"
    assert ram["connections"]["OCEB"] == [2] and ram["connections"]["OCEA"] == ["1"]
    assert [ram["connections"][f"DOB{i}"] for i in range(18)] == [[100 + i] for i in range(18)]
    assert set(net["modules"]["top"]["cells"]) == {"ram"}
    # The read pins' old nets are gone from the names.
    assert net["modules"]["top"]["netnames"]["rd"]["bits"] == ["x"] * 18


def test_hand_made_pseudo_dual_port_sets_both_halves():
    net = _netlist(width=36, pdp=True)
    done = absorb_output_registers(net)
    ram = _ram(net)
    assert done.flip_flops == 36 and done.ports == {"ram": "AB"}
    assert ram["parameters"]["REGMODE_A"] == ram["parameters"]["REGMODE_B"] == "OUTREG"
    assert ram["connections"]["OCEA"] == ram["connections"]["OCEB"] == [2]


def _refused(change):
    net = _netlist(width=36, pdp=True)
    change(net["modules"]["top"])
    before = copy.deepcopy(net)
    done = absorb_output_registers(net)
    assert done.flip_flops == 0 and net == before


@pytest.mark.parametrize("change", [
    # A set/reset input, or a power-up value of 1, the output register does not have.
    lambda m: m["cells"]["ff3"]["connections"].__setitem__("LSR", [7]),
    lambda m: m["cells"]["ff3"]["parameters"].__setitem__("REGSET", "SET"),
    # Another clock, an inverted clock, an inverted or a different enable.
    lambda m: m["cells"]["ff3"]["connections"].__setitem__("CLK", [8]),
    lambda m: m["cells"]["ff3"]["parameters"].__setitem__("CLKMUX", "INV"),
    lambda m: m["cells"]["ff3"]["parameters"].__setitem__("CEMUX", "INV"),
    lambda m: m["cells"]["ff3"]["connections"].__setitem__("CE", [9]),
    # A read pin with a second sink, or one that is a top-level output.
    lambda m: m["cells"].__setitem__("lut", {
        "type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
        "connections": {"A": [12], "Z": [200]}}),
    lambda m: m["ports"].__setitem__("rd", {"direction": "output", "bits": [12]}),
    # The RAM's reset of the port in use, or a write clock other than the read clock in the
    # pseudo-dual-port mode (a ROM's is constant).
    lambda m: m["cells"]["ram"]["connections"].__setitem__("RSTA", [5]),
    lambda m: m["cells"]["ram"]["connections"].__setitem__("CLKA", ["0"]),
    # A port already registered.
    lambda m: m["cells"]["ram"]["parameters"].__setitem__("REGMODE_B", "OUTREG"),
    # A register the design keeps in the fabric (one of its bits is enough).
    lambda m: m["netnames"].__setitem__("kept", {
        "bits": [103], "attributes": {FABRIC_ATTRIBUTE: "00000000000000000000000000000001"}}),
], ids=["lsr", "set", "clock", "inverted-clock", "inverted-enable", "two-enables",
        "fanout", "port", "ram-reset", "rom", "registered", "fabric"])
def test_hand_made_refusals(change):
    _refused(change)


def test_enable_always_on_and_unused_pins():
    """Flip-flops without an enable make OCE constant 1; pins nobody reads are left alone."""
    net = _netlist()
    cells = net["modules"]["top"]["cells"]
    for k in range(18):
        cells[f"ff{k}"]["parameters"]["CEMUX"] = "1 "
    del cells["ff17"]
    net["modules"]["top"]["ports"]["q"]["bits"].remove(117)
    done = absorb_output_registers(net)
    assert done.flip_flops == 17
    assert _ram(net)["connections"]["OCEB"] == ["1"]
    assert _ram(net)["connections"]["DOB17"] == [27]


def test_correct_stat():
    stat = {"design": {"num_cells": 10, "num_cells_by_type": {"TRELLIS_FF": 6, "DP16KD": 1}},
            "modules": {"\\top": {"num_cells": 10,
                                  "num_cells_by_type": {"TRELLIS_FF": 6, "DP16KD": 1}}}}
    net = _netlist(width=4)
    correct_stat(stat, absorb_output_registers(net))
    assert stat["design"]["num_cells_by_type"]["TRELLIS_FF"] == 2
    assert stat["modules"]["\\top"]["num_cells"] == 6
