"""The ``ptocube`` command line.

Each subcommand lives next to the code it drives and exposes two functions,
``add_arguments(parser)`` and ``run(args) -> int`` (the exit status).  This file
only wires them together, importing a subcommand's module when it is used so
that ``ptocube asm`` does not pay for elaborating hardware.
"""

import argparse
import importlib
import sys

__all__ = ["main"]

# name -> (module, one-line help)
SUBCOMMANDS = {
    "asm": ("ptocube.model.asm", "assemble PTO bundle assembly into instruction words"),
    "disasm": ("ptocube.model.asm", "disassemble instruction words into canonical assembly"),
    "decode": ("ptocube.model.decode", "decode instruction words into bundle descriptors (JSON)"),
    "run": ("ptocube.sim.run", "run a scenario on the golden model or the simulated hardware"),
    "demo": ("ptocube.sim.demo", "run the built-in demonstration program"),
    "verilog": ("ptocube.build.cli", "write the CUBE unit's Verilog for a preset"),
    "synth": ("ptocube.build.cli", "synthesise, place and route for a board's FPGA and report"),
    "build": ("ptocube.build.cli", "build a board bitstream of the self-test top"),
}


def _subcommand_hooks(name):
    module = importlib.import_module(SUBCOMMANDS[name][0])
    suffix = name.replace("-", "_")
    add = getattr(module, f"add_{suffix}_arguments", None) or module.add_arguments
    run = getattr(module, f"run_{suffix}", None) or module.run
    return add, run


def main(argv=None) -> int:
    """Entry point of the ``ptocube`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="ptocube",
        description="PTO ISA CUBE matrix unit: golden model, Amaranth hardware, tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # Only the chosen subcommand's module is imported.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (_, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            add, run = _subcommand_hooks(name)
            add(p)
            p.set_defaults(_run=run)
    args = parser.parse_args(argv)
    return args._run(args)


if __name__ == "__main__":
    sys.exit(main())
