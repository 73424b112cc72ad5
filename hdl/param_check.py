"""Combinational legality checks of B.FPATR parameter words, for the preflight.

:class:`ParamCheck` is the hardware twin of :func:`ptocube.model.postprocess.check_quant_word`
and :func:`~ptocube.model.postprocess.check_alpha_word`: the preflight presents each B.IOR
scalar and each column word of a vector-parameter tile and raises ``Fault_TileLegality`` when
the answer is 0.  The word layouts come from the model's
:data:`~ptocube.model.postprocess.PREQUANT_MODES` table at elaboration.
"""

from amaranth.hdl import Module
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
    """Legality of one quantization word and one activation word; combinational.

    Parameters
    ----------
    config : CubeConfig
        Only decides ``mode_built`` (the words are checked for every assigned mode).

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

    def __init__(self, config: CubeConfig = CubeConfig()):
        from .postprocess import built_modes     # postprocess imports nothing from here
        self.built = frozenset(built_modes(config))
        super().__init__({"mode": In(6), "quant": In(64), "alpha": In(64),
                          "quant_ok": Out(1), "alpha_ok": Out(1), "mode_built": Out(1)})

    def elaborate(self, platform):
        m = Module()
        word = self.quant
        scale_ok = fp19_class_ok(word[13:32], allow_zero=False)
        with m.Switch(self.mode):
            for code, mode in PREQUANT_MODES.items():
                with m.Case(code):
                    m.d.comb += self.mode_built.eq(code in self.built)
                    if mode.param is ParamKind.NONE:
                        continue                  # a mode without a parameter takes no word
                    if mode.shift:
                        m.d.comb += self.quant_ok.eq((word & (_ALL ^ _SHIFT_FIELD)) == 0)
                    else:
                        offset = ((1 << mode.offset_width) - 1) << _OFFSET_LSB
                        allowed = _SCALE_FIELD | offset
                        m.d.comb += self.quant_ok.eq(((word & (_ALL ^ allowed)) == 0) & scale_ok)
        alpha = self.alpha
        m.d.comb += self.alpha_ok.eq((alpha[19:] == 0)
                                     & fp19_class_ok(alpha[0:19], allow_zero=True))
        return m
