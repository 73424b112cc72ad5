"""Legality checks of B.FPATR parameter words, for the preflight.

:class:`ParamCheck` is the hardware twin of :func:`ptocube.model.postprocess.check_quant_word`
and :func:`~ptocube.model.postprocess.check_alpha_word`: the preflight presents each B.IOR
scalar and each column word of a vector-parameter tile and raises ``Fault_TileLegality`` when
the answer is 0.  The word layouts come from the model's
:data:`~ptocube.model.postprocess.PREQUANT_MODES` table at elaboration.
"""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..model.postprocess import PREQUANT_MODES, ParamKind
from .config import CubeConfig

__all__ = ["ParamCheck", "fp19_class_ok"]

#: Shift modes keep their code in bits[35:32]; scale modes the FP19 scale in bits[31:13] and
#: the signed offset from bit 37.
_SHIFT_FIELD = 0xF << 32
_SCALE_FIELD = 0x7FFFF << 13
_OFFSET_LSB = 37
_ALL = (1 << 64) - 1


def fp19_class_ok(bits, allow_zero: bool):
    """1 when the 19-bit FP19 value is positive normal (or +0 with ``allow_zero``)."""
    sign, exp, frac = bits[18], bits[10:18], bits[0:10]
    normal = (exp != 0) & (exp != 0xFF)
    if allow_zero:
        normal = normal | ((exp == 0) & (frac == 0))
    return ~sign & normal


class ParamCheck(wiring.Component):
    """Legality of one quantization word and one activation word (combinational, or one
    register deep).

    Parameters
    ----------
    config : CubeConfig
        Only decides ``mode_built`` (the words are checked for every assigned mode).
    registered : bool
        Register the tests of the words' fields and of the mode (``sync``): ``quant_ok``
        and ``alpha_ok`` then answer the words and the mode of the previous cycle
        (``mode_built`` stays combinational).  Otherwise all combinational.

    Members
    -------
    mode : In(6)
        PreQuantMode code.
    quant : In(64)
        Quantization word (B.IOR scalar or one column of the vector tile).
    alpha : In(64)
        LReLU/PReLU word.
    quant_ok : Out(1)
        ``check_quant_word(mode, quant)`` passes: the mode takes a parameter, a shift word
        sets only bits[35:32], a scale word has a positive normal FP19 in bits[31:13] and no
        bit outside it and the mode's offset field.
    alpha_ok : Out(1)
        ``check_alpha_word(alpha)`` passes: bits[18:0] are +0 or positive normal, the rest 0.
    mode_built : Out(1)
        ``mode`` is an assigned PreQuantMode this build implements
        (:func:`~ptocube.hdl.postprocess.built_modes`).
    """

    def __init__(self, config: CubeConfig = CubeConfig(), registered: bool = False):
        from .postprocess import built_modes     # postprocess imports nothing from here
        self.built = frozenset(built_modes(config))
        self.registered = registered
        super().__init__({"mode": In(6), "quant": In(64), "alpha": In(64),
                          "quant_ok": Out(1), "alpha_ok": Out(1), "mode_built": Out(1)})

    def elaborate(self, platform):
        m = Module()
        word = self.quant

        def modes(predicate):
            """1 when ``mode`` is a code of ``PREQUANT_MODES`` that satisfies ``predicate``:
            one constant bit table (a case per code was a compare and a priority mux per
            code, 7 levels before the verdict register, ``ptocube synth --paths``)."""
            table = sum(1 << code for code, mode in PREQUANT_MODES.items() if predicate(mode,
                                                                                      code))
            return Const(table, 64).bit_select(self.mode, 1)

        # The word's legality for each layout of parameter word, in parallel, then the
        # mode's: shift words, and scale words per width of the offset field.  With
        # ``registered``, each layout's field tests and the mode's table bit are registered
        # (64-bit zero tests, the mode's lookup, then their AND-OR: 7 levels in one piece).
        def field(value):
            if not self.registered:
                return value
            signal = Signal()
            m.d.sync += signal.eq(value)
            return signal

        scale_ok = fp19_class_ok(word[13:32], allow_zero=False)
        ok = [field(modes(lambda mode, code: mode.param is not ParamKind.NONE and mode.shift))
              & field((word & (_ALL ^ _SHIFT_FIELD)) == 0)]
        widths = sorted({mode.offset_width for mode in PREQUANT_MODES.values()
                         if mode.param is not ParamKind.NONE and not mode.shift})
        for width in widths:
            allowed = _SCALE_FIELD | ((1 << width) - 1) << _OFFSET_LSB
            ok.append(field(modes(lambda mode, code: mode.param is not ParamKind.NONE
                                  and not mode.shift and mode.offset_width == width))
                      & field(((word & (_ALL ^ allowed)) == 0) & scale_ok))
        m.d.comb += [self.quant_ok.eq(Cat(*ok).any()),
                     self.mode_built.eq(modes(lambda mode, code: code in self.built))]
        alpha = self.alpha
        m.d.comb += self.alpha_ok.eq(field((alpha[19:] == 0)
                                           & fp19_class_ok(alpha[0:19], allow_zero=True)))
        return m
