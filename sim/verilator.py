"""Cross-simulation on Verilator: run an Amaranth component's exported Verilog from Python.

The flow (``docs/verilator.md``):

1. :func:`ensure_verilator` checks for ``verilator``, ``g++`` and ``make`` (installing them with
   apt-get when running as root, else raising :class:`VerilatorMissing` with the command).
2. :meth:`VerilatorModel.build` exports the component's Verilog
   (``amaranth.back.verilog.convert``), finds its ``lib.stream`` ports and other ports, writes
   a small generated header (``ports.h``) next to the generic C++ driver
   ``sim/verilator/harness.cpp`` and builds both with Verilator, cached under a directory named
   by a hash of the Verilog, the driver and the tool version.
3. A :class:`VerilatorSession` keeps the compiled model running in a child process and sends
   it text requests (:func:`encode_request`): payloads for input streams, transfer counts for
   output streams, the idle/stall cycles of every transfer (drawn in Python from a seed), and
   reads back every transfer with its cycle (:func:`decode_response`).  The model's state
   persists between requests, so a driver can run a protocol in phases.

:func:`run_streams_verilator` has the signature and result of
:func:`ptocube.sim.harness.run_streams`, so a test can run the same stimulus on both
simulators.  Random stalls follow the same law (a geometric number of idle/not-ready cycles
before each transfer) but not the same random sequence, so only stall-free runs are
cycle-identical between the two.  :class:`VerilatorUnit` and :func:`run_scenario_verilator`
run scenarios on the Verilated CUBE unit through :mod:`ptocube.sim.hw_run`'s own scenario
steps (same host-port stimulus, cycle for cycle).
"""

import hashlib
import itertools
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from amaranth.hdl import Const, Shape, ShapeCastable, Signal, ValueCastable
from amaranth.hdl._ir import PortDirection     # the direction type verilog.convert's ports take
from amaranth.lib import stream, wiring

from .harness import Drain, Feed, RunResult

__all__ = ["VerilatorMissing", "VerilatorError", "REQUIRED_TOOLS", "VERILATOR_FLAGS",
           "ensure_verilator", "verilator_name", "StreamPort", "PlainPort", "Ports",
           "component_ports", "stall_counts", "encode_request", "decode_response", "Answer",
           "VerilatorModel", "VerilatorSession", "run_streams_verilator",
           "source_fingerprint", "default_cache_dir", "VerilatorUnit",
           "run_scenarios_verilator", "run_scenario_verilator", "main"]

#: Executable -> Debian package providing it.
REQUIRED_TOOLS = {"verilator": "verilator", "g++": "g++", "make": "make"}

#: Verilator options (toolchain.md: the flags that work with Debian's Verilator 5.006).
VERILATOR_FLAGS = ("-O3", "--x-assign", "fast", "--x-initial", "fast", "-Wno-fatal", "-Wno-lint",
                   "-Wno-style")

_HARNESS = Path(__file__).parent / "verilator" / "harness.cpp"


class VerilatorMissing(RuntimeError):
    """A tool that the Verilator flow needs is not installed (the message says what to do)."""


class VerilatorError(RuntimeError):
    """Building or running the Verilated model failed."""


def ensure_verilator(*, install=None, which=shutil.which, is_root=None, runner=subprocess.run):
    """Make sure ``verilator``, ``g++`` and ``make`` are on ``PATH``; return Verilator's version.

    Missing tools are installed with ``apt-get`` when running as root (unless ``install`` is
    false); otherwise :class:`VerilatorMissing` names the packages and the exact command.
    ``which``, ``is_root`` and ``runner`` exist so tests can fake a machine.
    """
    missing = [tool for tool in REQUIRED_TOOLS if which(tool) is None]
    if missing:
        packages = " ".join(REQUIRED_TOOLS[t] for t in missing)
        root = (os.geteuid() == 0) if is_root is None else is_root
        if install is None:
            install = root
        if install and root and which("apt-get") is not None:
            for command in (["apt-get", "update", "-q"],
                            ["apt-get", "install", "-y", "-q", *packages.split()]):
                done = runner(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
                if done.returncode:
                    raise VerilatorMissing(f"`{' '.join(command)}` failed: "
                                           f"{(done.stderr or '').strip()[-500:]}")
            missing = [tool for tool in REQUIRED_TOOLS if which(tool) is None]
        if missing:
            raise VerilatorMissing(
                f"Verilator cross-simulation needs {', '.join(missing)} on PATH. Install with: "
                f"{'' if root else 'sudo '}apt-get install -y {packages} "
                f"(Debian/Ubuntu packages: {packages}; Verilator 5.x)")
    version = runner(["verilator", "--version"], stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
    return (version.stdout or "").strip()


# ---------------------------------------------------------------------------
# Ports of a component, as they appear in the exported Verilog
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamPort:
    """A ``lib.stream`` member of the top level.

    ``name`` is the Verilog prefix (``i``, ``host__cmd``: Amaranth joins the member path with
    ``__``), ``direction`` is ``"in"`` when the component consumes the stream, ``width`` the
    payload bits; ``has_valid``/``has_ready`` are false for ``always_valid``/``always_ready``
    streams, whose constant member is no port.
    """
    name: str
    direction: str
    width: int
    shape: object
    has_valid: bool = True
    has_ready: bool = True

    @property
    def words(self) -> int:
        """32-bit words that carry the payload."""
        return max(1, -(-self.width // 32))


@dataclass(frozen=True)
class PlainPort:
    """A port that is not part of a stream.

    An input (``direction == "in"``, a *static* input) is held at a value the driver sets (at
    first the signal's ``init``, as in pysim); an output (a *probe*) is read after every run
    and can end a run (:meth:`VerilatorSession.run`'s ``quiet``).
    """
    name: str
    direction: str
    width: int
    init: int = 0

    @property
    def words(self) -> int:
        """32-bit words that carry the value."""
        return max(1, -(-self.width // 32))


@dataclass
class Ports:
    """The top level's ports: :class:`StreamPort` list (inputs, then outputs, each in signature
    order), static inputs and probes (:class:`PlainPort`), the ``ports`` dict for
    ``verilog.convert`` (constant members left out) and a map from ``id`` of each stream
    interface object to its :class:`StreamPort` (how ``Feed``/``Drain`` ports are resolved)."""
    streams: list
    statics: list
    probes: list
    verilog: dict
    objects: dict

    def stream(self, port) -> StreamPort:
        """The :class:`StreamPort` of a stream given as interface object or Verilog name."""
        if isinstance(port, str):
            for p in self.streams:
                if p.name == port:
                    return p
            raise KeyError(f"no stream {port!r}; streams: {[p.name for p in self.streams]}")
        try:
            return self.objects[id(port)]
        except KeyError:
            raise KeyError(f"{port!r} is not a stream member of the top level") from None

    def index(self, port: StreamPort) -> int:
        """Index of a stream among the inputs or the outputs (the harness's numbering)."""
        return [p for p in self.streams if p.direction == port.direction].index(port)

    def plain(self, name: str, direction: str) -> int:
        """Index of a static input (``"in"``) or probe (``"out"``) given by name."""
        items = self.statics if direction == "in" else self.probes
        for k, p in enumerate(items):
            if p.name == name:
                return k
        kind = "static input" if direction == "in" else "probe (plain output)"
        raise KeyError(f"no {kind} {name!r}; there are {[p.name for p in items]}")


def _port_value(value):
    if isinstance(value, ValueCastable):
        value = value.as_value()
    return value if isinstance(value, Signal) else None


def _members(signature, obj, path=(), flipped=False):
    """Yield ``(path, flow, member, value)`` for every member, expanding arrays of members."""
    for name, member in signature.members.items():
        value = getattr(obj, name)
        flow = member.flow if not flipped else member.flow.flip()
        for index in itertools.product(*(range(d) for d in member.dimensions)):
            item = value
            for i in index:
                item = item[i]
            yield path + (name,) + index, flow, member, item


def component_ports(component) -> Ports:
    """The :class:`Ports` of a ``wiring.Component``, named as in its exported Verilog."""
    if not isinstance(getattr(component, "signature", None), wiring.Signature):
        raise TypeError(f"{component!r} is not a wiring.Component (it needs a signature)")
    ports = Ports([], [], [], {}, {})

    def add_port(path, flow, value):
        signal = _port_value(value)
        if signal is None:
            return None
        ports.verilog["__".join(map(str, path))] = (
            signal, PortDirection.Input if flow == wiring.In else PortDirection.Output)
        return signal

    def walk(signature, obj, path, flipped):
        for sub_path, flow, member, value in _members(signature, obj, path, flipped):
            name = "__".join(map(str, sub_path))
            if member.is_signature and isinstance(member.signature, stream.Signature):
                shape = member.signature.members["payload"].shape
                # The producer drives payload/valid: an In stream member is consumed here.
                inner = wiring.In if flow == wiring.In else wiring.Out
                add_port(sub_path + ("payload",), inner, value.payload)
                port = StreamPort(name, "in" if flow == wiring.In else "out",
                                  Shape.cast(shape).width, shape,
                                  add_port(sub_path + ("valid",), inner, value.valid) is not None,
                                  add_port(sub_path + ("ready",), inner.flip(), value.ready)
                                  is not None)
                ports.streams.append(port)
                ports.objects[id(value)] = port
            elif member.is_signature:
                walk(member.signature, value, sub_path, flow == wiring.In)
            elif (signal := add_port(sub_path, flow, value)) is not None:
                width = len(signal)
                if flow == wiring.In:
                    ports.statics.append(PlainPort(name, "in", width,
                                                   signal.init & ((1 << width) - 1)))
                else:
                    ports.probes.append(PlainPort(name, "out", width))

    walk(component.signature, component, (), False)
    ports.streams.sort(key=lambda p: p.direction != "in")
    return ports


def verilator_name(name: str) -> str:
    """The C++ member Verilator gives a Verilog port (its ``encodeName``: a second ``_`` of a
    ``__`` pair becomes ``__05F``, other non-identifier characters ``__0XX``)."""
    out, i = [], 0
    while i < len(name):
        c = name[i]
        if c.isascii() and (c.isalpha() or (i and c.isdigit())):
            out.append(c)
        elif c == "_":
            if name[i + 1:i + 2] == "_":
                out.append("___05F")
                i += 1
            else:
                out.append("_")
        else:
            out.append(f"__0{ord(c):02X}")
        i += 1
    return "".join(out)


def _ports_header(top: str, ports: Ports, clock: bool, reset: bool) -> str:
    """The generated ``ports.h``: counts, payload word counts and accessors of one design.

    ``clock``/``reset``: the top level has ``clk``/``rst`` (a design without the ``sync``
    domain, or with a reset-less one, lacks them)."""
    streams, statics, probes = ports.streams, ports.statics, ports.probes
    ins = [p for p in streams if p.direction == "in"]
    outs = [p for p in streams if p.direction == "out"]

    def table(name, items):
        return (f"static const int {name}[] = {{{', '.join(str(p.words) for p in items)}"
                f"{', ' if items else ''}0}};")

    def switch(items, body):
        cases = "".join(f"        case {k}: {body(p)} break;\n" for k, p in enumerate(items))
        return f"    switch (k) {{\n{cases}        default: break;\n    }}\n"

    def member(p, signal):
        return "t->" + verilator_name(f"{p.name}__{signal}")

    def cast(p, signal, expr):
        return f"{member(p, signal)} = {expr};" if getattr(p, f"has_{signal}") else ""

    def valid_or_true(p):
        return f"return {member(p, 'valid') if p.has_valid else 'true'};"

    def ready_or_true(p):
        return f"return {member(p, 'ready') if p.has_ready else 'true'};"

    def drive_in(p):
        return cast(p, "valid", "valid") + f" put({member(p, 'payload')}, w, {p.words});"

    words = max([p.words for p in streams + statics + probes] + [1])
    return f"""// Generated by ptocube.sim.verilator for top level `{top}`; do not edit.
#include "V{top}.h"
#define VTOP V{top}
static const int N_IN = {len(ins)}, N_OUT = {len(outs)}, N_STATIC = {len(statics)};
static const int N_PROBE = {len(probes)}, MAX_WORDS = {words};
{table("IN_WORDS", ins)}
{table("OUT_WORDS", outs)}
{table("STATIC_WORDS", statics)}
{table("PROBE_WORDS", probes)}

static void in_drive(VTOP* t, int k, bool valid, const uint32_t* w) {{
{switch(ins, drive_in)}}}
static bool in_ready(VTOP* t, int k) {{
{switch(ins, ready_or_true)}    return false;
}}
static void out_drive(VTOP* t, int k, bool ready) {{
{switch(outs, lambda p: cast(p, "ready", "ready"))}}}
static bool out_valid(VTOP* t, int k) {{
{switch(outs, valid_or_true)}    return false;
}}
static void out_payload(VTOP* t, int k, uint32_t* w) {{
{switch(outs, lambda p: f"get({member(p, 'payload')}, w, {p.words});")}}}
static void static_set(VTOP* t, int k, const uint32_t* w) {{
{switch(statics, lambda p: f"put(t->{verilator_name(p.name)}, w, {p.words});")}}}
static void probe_get(VTOP* t, int k, uint32_t* w) {{
{switch(probes, lambda p: f"get(t->{verilator_name(p.name)}, w, {p.words});")}}}
static void clk_set(VTOP* t, bool v) {{ {"t->clk = v;" if clock else "(void)t; (void)v;"} }}
static void rst_set(VTOP* t, bool v) {{ {"t->rst = v;" if reset else "(void)t; (void)v;"} }}
"""


# ---------------------------------------------------------------------------
# Transactions: stall schedules, requests, answers
# ---------------------------------------------------------------------------

def stall_counts(rng, probability, count):
    """Idle (or not-ready) cycles before each of ``count`` transfers: geometric, ``probability``
    per cycle, as :func:`ptocube.sim.harness.run_streams` stalls."""
    counts = []
    for _ in range(count):
        n = 0
        while probability and rng.random() < probability:
            n += 1
        counts.append(n)
    return counts


def encode_request(*, feeds=(), drains=(), statics=(), monitors=(), quiet=(),
                   max_cycles=100_000, settle=8, min_cycles=0, reset=0) -> str:
    """One request of the harness protocol (``sim/verilator/harness.cpp``).

    ``feeds``: ``(stream index, payloads, idle counts)``; ``drains``: ``(stream index, stall
    counts)`` (one per expected transfer); ``statics``: ``(static index, value)``;
    ``monitors``: ``(stream index, on)``; ``quiet``: ``(probe index, cycles)``, the run lasts
    until the probe has read zero at that many edges in a row; ``reset``: cycles of ``rst``
    before the run; the run lasts at least ``min_cycles``.  Payloads are non-negative ints.
    """
    lines = [f"static {k} {value:x}" for k, value in statics]
    lines += [f"monitor {k} {int(bool(on))}" for k, on in monitors]
    lines += [f"quiet {k} {n}" for k, n in quiet]
    if reset:
        lines.append(f"reset {reset}")
    for k, payloads, idle in feeds:
        if len(payloads) != len(idle):
            raise ValueError("one idle count per payload")
        lines.append(f"feed {k} {len(payloads)}")
        lines += [f"{i} {p:x}" for i, p in zip(idle, payloads)]
    for k, stalls in drains:
        lines.append(f"drain {k} {len(stalls)}")
        lines += [str(s) for s in stalls]
    lines.append(f"go {max_cycles} {settle} {min_cycles}")
    return "\n".join(lines) + "\n"


@dataclass
class Answer:
    """A decoded answer: ``timeout``; ``cycles``, the cycle of the last expected transfer;
    ``total``, the cycles run (settle included); ``seconds``, CPU time of the model's cycle loop;
    per feed index the beats consumed; per output stream index the ``(cycle, payload)``
    transfers of drains, their surplus, and of monitored streams; per probe index its value
    at the end of the run."""
    timeout: bool
    cycles: int
    total: int
    seconds: float
    fed: dict
    transfers: dict
    extra: dict
    monitored: dict
    probes: dict


def decode_response(lines) -> Answer:
    """Parse the harness's answer (an iterable of lines, up to and including ``end``)."""
    lines = iter(lines)
    first = next(lines).split()
    if len(first) != 4 or first[0] not in ("done", "timeout"):
        raise VerilatorError(f"unexpected answer from the Verilated model: {' '.join(first)}")
    answer = Answer(first[0] == "timeout", int(first[1]), int(first[2]), int(first[3]) * 1e-9,
                    {}, {}, {}, {}, {})
    targets = {"drain": answer.transfers, "extra": answer.extra, "monitor": answer.monitored}
    for line in lines:
        words = line.split()
        if words == ["end"]:
            return answer
        kind, k = words[0], int(words[1])
        if kind == "fed":
            answer.fed[k] = int(words[2])
            continue
        if kind == "probe":
            answer.probes[k] = int(words[2], 16)
            continue
        n = int(words[2])
        items = []
        for _ in range(n):
            cycle, payload = next(lines).split()
            items.append((int(cycle), int(payload, 16)))
        targets[kind][k] = items
    raise VerilatorError("the Verilated model's answer ended early")


# ---------------------------------------------------------------------------
# Build and run
# ---------------------------------------------------------------------------

def default_cache_dir() -> Path:
    """``$PTOCUBE_VERILATOR_CACHE``, else ``.verilator-cache/`` in a source checkout, else
    ``~/.cache/ptocube/verilator``."""
    if os.environ.get("PTOCUBE_VERILATOR_CACHE"):
        return Path(os.environ["PTOCUBE_VERILATOR_CACHE"])
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").exists():
        return root / ".verilator-cache"
    return Path.home() / ".cache" / "ptocube" / "verilator"


def _payload_bits(port: StreamPort, payload) -> int:
    """A payload as its bit pattern: an int, or anything the payload shape's ``const`` takes."""
    if isinstance(payload, int):
        bits = payload
    elif isinstance(port.shape, ShapeCastable):
        bits = Const.cast(port.shape.const(payload)).value
    else:
        bits = int(payload)
    if bits < 0 or bits >> port.width:
        raise ValueError(f"payload {payload!r} does not fit the {port.width}-bit payload of "
                         f"stream {port.name!r}")
    return bits


def source_fingerprint(*packages, extra: str = "") -> str:
    """A hash of every ``.py`` file of ``packages`` (module objects or names), Amaranth's
    version and ``extra``: what a design elaborated from that source depends on."""
    import importlib
    import amaranth
    digest = hashlib.sha256(f"{amaranth.__version__}\0{extra}".encode())
    for package in packages:
        if isinstance(package, str):
            package = importlib.import_module(package)
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _prune(cache: Path, top: str, keep: int):
    """Delete all but the ``keep`` newest builds of ``top`` (old Verilog of edited designs)."""
    builds = sorted((d for d in cache.glob(f"{top}-*") if (d / "build.log").exists()),
                    key=lambda d: d.stat().st_mtime, reverse=True)
    for old in builds[keep:]:
        shutil.rmtree(old, ignore_errors=True)


@dataclass
class VerilatorModel:
    """A component's Verilated model: the executable and its port tables (:class:`Ports`)."""
    top: str
    executable: Path
    ports: Ports
    build_seconds: float
    cached: bool

    @classmethod
    def build(cls, component, *, name=None, fingerprint=None, cache_dir=None, jobs=2,
              install=None, keep=4, log=None):
        """Export ``component`` to Verilog and build it (or reuse a cached build).

        The cache key is a hash of the Verilog (with the driver and the tool version), or of
        ``fingerprint`` when given: a string that determines the design, such as
        :func:`source_fingerprint` plus the elaboration parameters, which skips the Verilog
        export of a cached design (minutes for a big one).  ``name`` is the Verilog top
        module (default: the class name, lowercased).  ``build_seconds`` covers export and
        compilation; ``cached`` tells whether compilation was skipped.  The cache keeps the
        ``keep`` newest builds of each name.  ``log(message)``, when given, hears about the
        slow steps before they start.
        """
        from amaranth.back import verilog
        start = time.perf_counter()
        version = ensure_verilator(install=install)
        top = name or re.sub(r"\W", "_", type(component).__name__.lower())
        ports = component_ports(component)
        driver = _HARNESS.read_text()
        cache = Path(cache_dir) if cache_dir else default_cache_dir()

        def located(*parts):
            key = hashlib.sha256("\0".join(
                [top, *parts, driver, version, " ".join(VERILATOR_FLAGS)]).encode())
            final = cache / f"{top}-{key.hexdigest()[:16]}"
            return final, final / "obj" / f"V{top}"

        if fingerprint is not None:
            final, executable = located("fingerprint", fingerprint)
            if executable.exists():
                final.touch()              # most recently used: kept by _prune
                return cls(top, executable, ports, time.perf_counter() - start, True)
        if log:
            log(f"exporting the Verilog of {top}")
        text = verilog.convert(component, name=top, ports=ports.verilog, emit_src=False)
        module = text[text.index(f"module {top}("):]
        module = module[:module.index("endmodule")]
        header = _ports_header(top, ports,
                               clock=re.search(r"^\s*input clk;", module, re.M) is not None,
                               reset=re.search(r"^\s*input rst;", module, re.M) is not None)
        if fingerprint is None:
            final, executable = located(text, header)
        cached = executable.exists()
        if cached:
            final.touch()
        else:
            if log:
                log(f"building {top} with Verilator ({len(text) >> 10} KiB of Verilog) in {cache}")
            cache.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=f".{top}-", dir=cache))
            try:
                (work / f"{top}.v").write_text(text)
                (work / "ports.h").write_text(header)
                shutil.copy(_HARNESS, work / "harness.cpp")
                command = ["verilator", "--cc", "--exe", "--build", *VERILATOR_FLAGS,
                           "-j", str(jobs), "--top-module", top, "-Mdir", "obj",
                           f"{top}.v", "harness.cpp"]
                done = subprocess.run(command, cwd=work, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
                if done.returncode:
                    raise VerilatorError(f"Verilator build of {top} failed: "
                                         f"{' '.join(command)}\n{done.stdout[-3000:]}")
                (work / "build.log").write_text(done.stdout)
                # Publish atomically; a concurrent build of the same key may have won.
                try:
                    work.rename(final)
                except OSError:
                    if not executable.exists():
                        raise
            finally:
                shutil.rmtree(work, ignore_errors=True)
            _prune(cache, top, keep)
        return cls(top, executable, ports, time.perf_counter() - start, cached)

    def session(self) -> "VerilatorSession":
        """Start the model (fresh state: every register at its reset value)."""
        return VerilatorSession(self)


class VerilatorSession:
    """A running Verilated model; each :meth:`run` continues from the state the last left.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, model: VerilatorModel):
        self.model = model
        self.ports = model.ports
        #: Cycles run, and CPU seconds spent in the model's cycle loop, over all runs.
        self.cycles = 0
        self.model_seconds = 0.0
        #: Transfers of monitored output streams (Verilog name -> ``(cycle, payload)`` list,
        #: cycles counted from the session's start).
        self.monitored = {}
        #: Value of every probe (plain output) at the end of the last run.
        self.probes = {}
        # Verilator starts inputs at 0; pysim starts them at their init value.
        self._initial = [(k, p.init) for k, p in enumerate(self.ports.statics) if p.init]
        self._monitors = []
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen([str(model.executable)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                         bufsize=1 << 16)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Stop the model's process."""
        if self._process.poll() is None:
            try:
                self._process.stdin.write("quit\n")
                self._process.stdin.close()
            except BrokenPipeError:
                pass
            self._process.wait(timeout=30)
        self._process.stdout.close()
        self._stderr.close()

    def _exchange(self, request: str) -> Answer:
        try:
            self._process.stdin.write(request)
            self._process.stdin.flush()
            return decode_response(iter(self._process.stdout.readline, ""))
        except (BrokenPipeError, StopIteration, VerilatorError) as exc:
            self._process.wait(timeout=30)
            self._stderr.seek(0)
            raise VerilatorError(f"the Verilated model {self.model.top} stopped "
                                 f"(exit {self._process.returncode}): "
                                 f"{self._stderr.read()[-2000:]}") from exc

    def monitor(self, port, on: bool = True):
        """Hold output stream ``port`` ready in every later run and log its transfers in
        :attr:`monitored` (as a testbench that keeps ``ready`` high and samples ``valid``)."""
        port = self.ports.stream(port)
        if port.direction != "out":
            raise ValueError(f"stream {port.name!r} is an input; it cannot be monitored")
        self._monitors.append((self.ports.index(port), on))
        self.monitored.setdefault(port.name, [])

    def run(self, *, feeds=(), drains=(), stall=0.0, seed=0, max_cycles=100_000, settle=8,
            static=None, quiet=None, min_cycles=0, reset=0) -> RunResult:
        """Feed and drain streams as :func:`ptocube.sim.harness.run_streams` does.

        ``feeds``/``drains`` are :class:`ptocube.sim.harness.Feed`/``Drain`` whose ``port`` is a
        stream interface of the component (or its Verilog name).  ``static`` maps static input
        names to values (kept for later runs).  ``quiet`` maps probe names to a cycle count:
        the run also lasts until that probe has read zero at that many clock edges in a row.
        The run lasts at least ``min_cycles``.  ``reset`` pulses ``rst`` for that many cycles
        first.  Cycle numbers count from this run's start.
        """
        in_stall, out_stall = stall if isinstance(stall, tuple) else (stall, stall)
        rng = random.Random(seed)
        request_feeds, request_drains, order = [], [], []
        for feed in feeds:
            port = self.ports.stream(feed.port)
            if port.direction != "in":
                raise ValueError(f"stream {port.name!r} is an output; it cannot be fed")
            payloads = [_payload_bits(port, p) for p in feed.payloads]
            request_feeds.append((self.ports.index(port), payloads,
                                  stall_counts(rng, in_stall if port.has_valid else 0,
                                               len(payloads))))
        for drain in drains:
            port = self.ports.stream(drain.port)
            if port.direction != "out":
                raise ValueError(f"stream {port.name!r} is an input; it cannot be drained")
            # An always-ready stream cannot be held back: no stalls.
            request_drains.append((self.ports.index(port),
                                   stall_counts(rng, out_stall if port.has_ready else 0,
                                                drain.count)))
            order.append(self.ports.index(port))
        if len(set(order)) != len(order):
            raise ValueError("each output stream can be drained once per run")
        statics, self._initial = self._initial, []
        for name, value in (static or {}).items():
            k = self.ports.plain(name, "in")
            statics.append((k, int(value) & ((1 << self.ports.statics[k].width) - 1)))
        waits = [(self.ports.plain(name, "out"), int(n)) for name, n in (quiet or {}).items()]
        monitors, self._monitors = self._monitors, []
        answer = self._exchange(encode_request(
            feeds=request_feeds, drains=request_drains, statics=statics, monitors=monitors,
            quiet=waits, max_cycles=max_cycles, settle=settle, min_cycles=min_cycles,
            reset=reset))
        outs = [p for p in self.ports.streams if p.direction == "out"]
        for k, items in answer.monitored.items():
            self.monitored[outs[k].name] += [(self.cycles + c, p) for c, p in items]
        self.probes = {self.ports.probes[k].name: v for k, v in answer.probes.items()}
        self.cycles += answer.total
        self.model_seconds += answer.seconds
        if answer.timeout:
            progress = ", ".join(
                [f"feed {k} consumed {n}" for k, n in sorted(answer.fed.items())] +
                [f"drain {k} received {len(t)}" for k, t in sorted(answer.transfers.items())])
            raise TimeoutError(f"after {max_cycles} cycles the Verilated model is not done "
                               f"({progress or 'waiting'})")
        outputs = [[p for _, p in answer.transfers[k]] for k in order]
        stamps = [[c for c, _ in answer.transfers[k]] for k in order]
        extra = [[p for _, p in answer.extra[k]] for k in order]
        return RunResult(outputs, extra, answer.cycles, stamps)


_MODELS = weakref.WeakKeyDictionary()


def run_streams_verilator(dut, *, feeds=(), drains=(), stall=0.0, seed=0, max_cycles=100_000,
                          settle=8, static=None, cache_dir=None) -> RunResult:
    """:func:`ptocube.sim.harness.run_streams` on Verilator (one fresh model per call).

    The model is built once per component object (and cached on disk by its Verilog).
    """
    if dut not in _MODELS:
        _MODELS[dut] = VerilatorModel.build(dut, cache_dir=cache_dir)
    with _MODELS[dut].session() as session:
        return session.run(feeds=feeds, drains=drains, stall=stall, seed=seed,
                           max_cycles=max_cycles, settle=settle, static=static)


# ---------------------------------------------------------------------------
# The CUBE unit on Verilator: scenarios through the host port
# ---------------------------------------------------------------------------

#: Cycles one host transaction or program phase may take before the run counts as hung.
UNIT_MAX_CYCLES = 5_000_000


def _complete(coroutine):
    """Run a coroutine whose awaits all finish at once (the Verilator unit's methods)."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    coroutine.close()
    raise RuntimeError("a Verilator unit step waited on something outside the model")


class VerilatorUnit:
    """A Verilated :class:`~ptocube.hdl.top.CubeUnit` with the testbench interface of
    :class:`ptocube.sim.hw_run.SimUnit` (``config``, ``cycle``, ``statuses``, async
    ``setup``/``transact``/``drive``/``send_beats``/``drain``, ``run``), so the scenario
    steps of :mod:`ptocube.sim.hw_run` drive it unchanged, with the same stimulus timing.

    The methods are coroutines that never suspend: each is one or two requests to the
    Verilated model; :meth:`run` executes a testbench coroutine with ``ctx=None``.
    """

    def __init__(self, config, *, cube=None, cache_dir=None, log=None):
        from ..hdl.top import CubeUnit
        self.config = config
        unit = CubeUnit(config, cube=cube)
        fingerprint = source_fingerprint("ptocube.hdl", "ptocube.model",
                                         extra=f"{config!r} cube={unit.has_cube}")
        self.model = VerilatorModel.build(unit, name="cube_unit", fingerprint=fingerprint,
                                          cache_dir=cache_dir, log=log)
        self.session = self.model.session()
        # SimUnit holds status (and host_rsp) ready from the start and logs every status.
        self.session.monitor("status")
        self.statuses = []

    @property
    def cycle(self) -> int:
        """Clock cycles since the unit started."""
        return self.session.cycles

    def close(self):
        """Stop the model."""
        self.session.close()

    def _run(self, **kwargs):
        from ..hdl.host import decode_status
        result = self.session.run(settle=0, max_cycles=UNIT_MAX_CYCLES, **kwargs)
        log = self.session.monitored["status"]
        self.statuses += [decode_status(bits) for _, bits in log[len(self.statuses):]]
        return result

    async def setup(self, ctx):
        """Nothing to do: the status stream is monitored (always ready) from the start."""

    async def transact(self, ctx, cmd):
        """Send one host command and return its decoded response."""
        from ..hdl.host import decode_response as decode_host_response, encode_command
        result = self._run(feeds=[Feed("host_cmd", [encode_command(cmd)])],
                           drains=[Drain("host_rsp", 1)])
        return decode_host_response(result.outputs[0][0])

    async def drive(self, ctx, gen):
        """Run a :mod:`ptocube.sim.host` driver generator; returns its result."""
        from .host import run_sync
        return run_sync(gen, lambda cmd: _complete(self.transact(ctx, cmd)))

    async def send_beats(self, ctx, beats):
        """Stream parcel beats (no stalls)."""
        self._run(feeds=[Feed("parcels", beats)])

    async def drain(self, ctx):
        """Wait until ``busy`` has been low for ``hw_run.DRAIN_CYCLES`` cycles in a row."""
        from .hw_run import DRAIN_CYCLES
        self._run(quiet={"busy": DRAIN_CYCLES})

    def run(self, testbench, vcd=None):
        """Run ``testbench(ctx)`` to completion (no waveform: ``vcd`` must be None)."""
        if vcd:
            raise ValueError("the Verilator engine writes no waveform; use --engine sim")
        _complete(testbench(None))


def run_scenarios_verilator(scenarios, config="sim-small", *, cube=None, cache_dir=None,
                            log=None):
    """:func:`ptocube.sim.hw_run.run_scenarios_hw` on the Verilated unit: one item per
    scenario, its result dict (``engine: "verilator"``) or the ``HardwareUnavailable`` it
    raised.  ``log``: see :meth:`VerilatorModel.build` (the first build takes minutes)."""
    from ..hdl.config import preset
    from ..model.scenario import Scenario, load_scenario
    from .host import clear_state
    from .hw_run import HardwareUnavailable, run_one
    scenarios = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]
    for s in scenarios:
        if s.arithmetic != "ieee":
            raise HardwareUnavailable(f"the hardware implements the ieee arithmetic only; "
                                      f"scenario {s.name!r} asks for {s.arithmetic!r}")
    if isinstance(config, str):
        config = preset(config)
    unit = VerilatorUnit(config, cube=cube, cache_dir=cache_dir, log=log)
    results = []

    async def main(ctx):
        for k, scenario in enumerate(scenarios):
            if k:
                await unit.drive(ctx, clear_state(scenarios[k - 1].state))
            result = await run_one(ctx, unit, scenario, skip_zero=k == 0)
            if isinstance(result, dict):
                result["engine"] = "verilator"
            results.append(result)

    try:
        unit.run(main)
    finally:
        unit.close()
    return results


def run_scenario_verilator(scenario, config="sim-small", *, cube=None, cache_dir=None,
                           log=None) -> dict:
    """Run a scenario on the Verilated unit: the result of
    :func:`ptocube.sim.hw_run.run_scenario_hw` with ``engine: "verilator"``.

    Raises ``HardwareUnavailable`` like it, and :class:`VerilatorMissing` without the tools.
    """
    result = run_scenarios_verilator([scenario], config, cube=cube, cache_dir=cache_dir,
                                     log=log)[0]
    if isinstance(result, Exception):
        raise result
    return result


def main(argv=None) -> int:
    """``python -m ptocube.sim.verilator``: check (as root: install) the tools; exit 2 if
    they are missing.  For ``make regress``."""
    import sys
    try:
        print(ensure_verilator())
    except VerilatorMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
