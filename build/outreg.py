"""Block-RAM output registers for ECP5 netlists: flip-flops after a DP16KD moved into it.

The ECP5's block RAM (DP16KD) has an optional register on each read port (``REGMODE_A`` /
``REGMODE_B`` = ``OUTREG``, enabled by ``OCEA`` / ``OCEB``). yosys's ``synth_ecp5`` never uses
it: every memory read port maps to ``NOREG``, whose clock-to-output is 5.8 ns on speed grade 6
against about 1.2 ns from the output register (``build.paths.DelayModel``). A design that
registers a block RAM's read data right after the port (an extra pipeline stage the RTL, and
Amaranth's simulator, know about) still pays the slow output into that register, across
whatever wire the placer gives it.

:func:`absorb_output_registers` rewrites yosys's JSON netlist so that such a register *is* the
RAM's output register, a transformation with no effect on behaviour:

* a read port qualifies when every read-data pin in use drives exactly one sink, the ``DI``
  of a ``TRELLIS_FF`` (no other logic, no top-level port), and those flip-flops all share the
  port's clock (neither inverted), one enable (or none), no set/reset input and the
  power-up value 0 (``REGSET`` = ``RESET``), as the RAM's output register has; the RAM's own
  reset input of that port must be constant 0;
* in a pseudo-dual-port RAM of 36-bit words (``DATA_WIDTH_B`` = 36: both ``DOA`` and ``DOB``
  carry read data of port B) both ports' settings change together, and the write clock must
  be the read clock;
* none of the flip-flops' outputs is a net carrying the attribute ``ptocube_fabric``
  (``hdl.logic.FABRIC_REGISTER``): the design keeps such a register in the fabric
  (decision F48);
* the flip-flops are removed, the read-data pins drive their outputs, ``REGMODE_x`` becomes
  ``OUTREG`` and ``OCEx`` their enable.

The output register loads the value the port's read latch holds before the clock edge, as a
flip-flop after a ``NOREG`` port does: the RAM's read latency and the register's enable are
unchanged, the register has only moved into the block. yosys's cell counts in ``stat -json``
are corrected with :func:`correct_stat`.
"""

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..hdl.logic import FABRIC_REGISTER

__all__ = ["FABRIC_ATTRIBUTE", "Absorbed", "absorb_output_registers", "absorb_in_file",
           "correct_stat"]

#: The net attribute of a register the pass leaves in the fabric.
(FABRIC_ATTRIBUTE,) = FABRIC_REGISTER


@dataclass
class Absorbed:
    """What :func:`absorb_output_registers` changed: per RAM cell, the read ports whose
    registers it took in (``ports``) and the flip-flops removed (``flip_flops``)."""

    ports: dict = field(default_factory=dict)       # cell name -> "A" | "B" | "AB"
    flip_flops: int = 0

    def summary(self) -> str:
        return (f"{len(self.ports)} DP16KD read ports take their output register "
                f"(REGMODE OUTREG): {self.flip_flops} flip-flops moved into them")


def _width(params: dict, name: str) -> int:
    value = params.get(name, "0")
    return int(value, 2) if isinstance(value, str) else int(value)


def _read_ports(cell: dict) -> list:
    """(data pins, control port letters) of each read port of a DP16KD cell."""
    params = cell["parameters"]
    if _width(params, "DATA_WIDTH_B") == 36:
        # Pseudo-dual-port: port B reads 36 bits, the upper half on DOA.
        pins = [f"DOB{i}" for i in range(18)] + [f"DOA{i}" for i in range(18)]
        return [(pins, "AB")]
    return [([f"DO{p}{i}" for i in range(18)], p) for p in "AB"]


def _constant(bits) -> str | None:
    """The constant a single-bit connection ties to, if it is one."""
    return bits[0] if bits and isinstance(bits[0], str) else None


def _enable(ff: dict):
    """The flip-flop's enable: a net bit, ``"1"`` (always), or ``None`` (one we do not take:
    an inverted enable)."""
    mux = str(ff["parameters"].get("CEMUX", "CE")).strip()
    if mux == "1":
        return "1"
    if mux == "CE":
        return ff["connections"].get("CE", ["1"])[0]
    return None


def _plain(ff: dict, clock) -> bool:
    """The flip-flop is clocked by ``clock``, has no set/reset and powers up at 0."""
    params, conns = ff["parameters"], ff["connections"]
    lsr = conns.get("LSR", ["0"])
    return (conns.get("CLK", [None])[0] == clock
            and str(params.get("CLKMUX", "CLK")).strip() == "CLK"
            and _constant(lsr) == "0"
            and str(params.get("REGSET", "RESET")).strip() == "RESET")


def absorb_output_registers(netlist: dict) -> Absorbed:
    """Move the flip-flops that register DP16KD read data into the RAMs (in place).

    ``netlist`` is yosys's JSON netlist after ``synth_ecp5`` (flat); every module is
    rewritten. Returns what changed.
    """
    done = Absorbed()
    for module in netlist["modules"].values():
        _absorb_in_module(module, done)
    return done


def _absorb_in_module(module: dict, done: Absorbed) -> None:
    cells = module["cells"]
    sinks = defaultdict(list)
    for name, cell in cells.items():
        directions = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            if directions.get(port) == "input":
                for bit in bits:
                    if isinstance(bit, int):
                        sinks[bit].append((name, port))
    outputs = {bit for port in module.get("ports", {}).values()
               if port["direction"] != "input" for bit in port["bits"] if isinstance(bit, int)}
    fabric = {bit for net in module.get("netnames", {}).values()
              if FABRIC_ATTRIBUTE in net.get("attributes", {}) for bit in net["bits"]}
    removed = set()
    for name, cell in list(cells.items()):
        if cell["type"] != "DP16KD":
            continue
        params, conns = cell["parameters"], cell["connections"]
        for pins, letters in _read_ports(cell):
            if any(params.get(f"REGMODE_{p}", "NOREG") != "NOREG" for p in letters):
                continue
            if any(_constant(conns.get(f"RST{p}", ["0"])) != "0" for p in letters):
                continue
            if any(str(params.get(f"CLK{p}MUX", f"CLK{p}")).strip() != f"CLK{p}"
                   for p in letters):
                continue
            clocks = {conns.get(f"CLK{p}", [None])[0] for p in letters}
            if len(clocks) != 1:
                continue
            clock = clocks.pop()
            taken = _registers(pins, conns, sinks, outputs, cells, clock)
            if not taken or any(cells[ff]["connections"]["Q"][0] in fabric for _, ff in taken):
                continue
            enable = _enable(cells[taken[0][1]])
            for pin, ff_name in taken:
                conns[pin] = list(cells[ff_name]["connections"]["Q"])
                removed.add(ff_name)
            for p in letters:
                params[f"REGMODE_{p}"] = "OUTREG"
                conns[f"OCE{p}"] = [enable]
            done.ports[name] = done.ports.get(name, "") + letters
            done.flip_flops += len(taken)
    for ff_name in removed:
        del cells[ff_name]
    _forget_dangling(module, cells)


def _registers(pins, conns, sinks, outputs, cells, clock) -> list:
    """(pin, flip-flop) for each read-data pin in use if the port qualifies, else []."""
    taken, enables = [], set()
    for pin in pins:
        bits = conns.get(pin)
        if not bits or not isinstance(bits[0], int):
            continue
        bit = bits[0]
        users = sinks.get(bit, [])
        if not users:
            continue                 # an unused pin: its register loads nothing anyone reads
        if bit in outputs or len(users) != 1:
            return []
        ff_name, port = users[0]
        ff = cells[ff_name]
        if ff["type"] != "TRELLIS_FF" or port != "DI" or not _plain(ff, clock):
            return []
        enable = _enable(ff)
        if enable is None:
            return []
        enables.add(enable)
        taken.append((pin, ff_name))
    return taken if len(enables) == 1 else []


def _forget_dangling(module: dict, cells: dict) -> None:
    """Net names keep the read pins' old nets, now driven by nothing: name them "x"."""
    used = {bit for cell in cells.values() for bits in cell["connections"].values()
            for bit in bits if isinstance(bit, int)}
    used |= {bit for port in module.get("ports", {}).values() for bit in port["bits"]
             if isinstance(bit, int)}
    for net in module.get("netnames", {}).values():
        net["bits"] = [bit if not isinstance(bit, int) or bit in used else "x"
                       for bit in net["bits"]]


def correct_stat(stat: dict, absorbed: Absorbed) -> None:
    """Take the absorbed flip-flops out of yosys's ``stat -json`` counts (in place)."""
    if not absorbed.flip_flops:
        return
    for counts in [stat.get("design", {}), *stat.get("modules", {}).values()]:
        by_type = counts.get("num_cells_by_type")
        if by_type and by_type.get("TRELLIS_FF"):
            by_type["TRELLIS_FF"] -= absorbed.flip_flops
            counts["num_cells"] = counts.get("num_cells", 0) - absorbed.flip_flops


def absorb_in_file(netlist_path, stat_path=None, log_path=None) -> Absorbed:
    """:func:`absorb_output_registers` on a JSON netlist file, rewritten in place, with its
    ``stat -json`` file corrected and the summary and every RAM port written to
    ``log_path`` (each if given)."""
    netlist_path = Path(netlist_path)
    netlist = json.loads(netlist_path.read_text())
    absorbed = absorb_output_registers(netlist)
    if absorbed.flip_flops:
        netlist_path.write_text(json.dumps(netlist))
    if stat_path is not None and Path(stat_path).exists() and absorbed.flip_flops:
        stat = json.loads(Path(stat_path).read_text())
        correct_stat(stat, absorbed)
        Path(stat_path).write_text(json.dumps(stat, indent=1))
    if log_path is not None:
        lines = [absorbed.summary()] + [f"{name} {ports}"
                                        for name, ports in sorted(absorbed.ports.items())]
        Path(log_path).write_text("\n".join(lines) + "\n")
    return absorbed
