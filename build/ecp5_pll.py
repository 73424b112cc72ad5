"""An ECP5 PLL (EHXPLLL) that makes the clock the unit runs at from a board's oscillator.

The unit's post-route Fmax on the ECP5-85F is below the ULX3S's 25 MHz and the ECPIX-5's
100 MHz oscillators, so a board top clocks the self-test from a PLL output at a frequency
the unit meets (decision F20). nextpnr derives the output's constraint from the input's
and the dividers, so the routed report has the unit's clock under its own frequency.
"""

import math
from dataclasses import dataclass

from amaranth.hdl import ClockDomain, ClockSignal, Const, Instance, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import AsyncFFSynchronizer
from amaranth.lib.wiring import In

__all__ = ["PllDividers", "pll_dividers", "Ecp5Pll"]

# Ranges of the ECP5 sysCLOCK PLL (Lattice FPGA-DS-02012, "sysCLOCK PLL Timing"), in MHz.
_CLKI = (8.0, 400.0)
_PFD = (3.125, 400.0)
_VCO = (400.0, 800.0)
_CLKOP = (3.125, 400.0)
_DIV = range(1, 129)
_FB_DIV = range(1, 81)


@dataclass(frozen=True)
class PllDividers:
    """EHXPLLL dividers with CLKOP fed back: ``out = in * clkfb / clki``,
    ``vco = out * clkop``."""
    clki: int
    clkfb: int
    clkop: int
    in_mhz: float

    @property
    def out_mhz(self) -> float:
        """The output frequency."""
        return self.in_mhz * self.clkfb / self.clki

    @property
    def vco_mhz(self) -> float:
        """The oscillator's frequency (400-800 MHz)."""
        return self.out_mhz * self.clkop


def pll_dividers(in_mhz: float, out_mhz: float) -> PllDividers:
    """The dividers whose output is the highest frequency not above ``out_mhz``.

    Raises ``ValueError`` when the input is outside the PLL's range or no output within
    3.125 MHz..``out_mhz`` can be made.
    """
    if not _CLKI[0] <= in_mhz <= _CLKI[1]:
        raise ValueError(f"PLL input {in_mhz} MHz is outside {_CLKI[0]}-{_CLKI[1]} MHz")
    best = None
    for clki in _DIV:
        pfd = in_mhz / clki
        if pfd < _PFD[0]:
            break
        for clkfb in _FB_DIV:
            out = pfd * clkfb
            if out > out_mhz + 1e-9 or out > _CLKOP[1]:
                break
            if out < _CLKOP[0]:
                continue
            clkop = math.ceil(_VCO[0] / out - 1e-9)
            if clkop in _DIV and out * clkop <= _VCO[1] and (best is None or out > best.out_mhz):
                best = PllDividers(clki, clkfb, clkop, in_mhz)
    if best is None:
        raise ValueError(f"no ECP5 PLL setting makes {out_mhz} MHz or less from {in_mhz} MHz "
                         f"(the output range is {_CLKOP[0]}-{_CLKOP[1]} MHz)")
    return best


class Ecp5Pll(wiring.Component):
    """The ``domain`` clock domain, clocked by an EHXPLLL from ``clk_in`` and held in reset
    until the PLL locks (asserted at once, released on the new clock).

    The reset reaches the domain's flip-flops through a DCCA, on a global network like the
    clock: on the whole unit it has over 22,000 loads, and through the fabric its tree took
    general routing where the unit is most congested (decision F23).

    ``in_mhz`` is the input's frequency, ``out_mhz`` an upper bound of the output's; the
    frequency made is ``dividers.out_mhz``.
    """

    clk_in: In(1)

    def __init__(self, in_mhz: float, out_mhz: float, domain: str = "sync"):
        self.dividers = pll_dividers(in_mhz, out_mhz)
        self.domain = domain
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        d = self.dividers
        clk_out, locked = Signal(), Signal()
        m.submodules.pll = Instance(
            "EHXPLLL",
            # For the vendor tools; nextpnr computes the output frequency from the dividers.
            a_FREQUENCY_PIN_CLKI=f"{d.in_mhz:g}", a_FREQUENCY_PIN_CLKOP=f"{d.out_mhz:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_CLKOP_ENABLE="ENABLED",
            p_CLKI_DIV=d.clki, p_CLKFB_DIV=d.clkfb, p_CLKOP_DIV=d.clkop,
            p_CLKOP_CPHASE=d.clkop - 1, p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            i_CLKI=self.clk_in, i_CLKFB=clk_out, o_CLKOP=clk_out, o_LOCK=locked,
            i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1,
            i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0)
        m.domains += ClockDomain(self.domain)
        m.d.comb += ClockSignal(self.domain).eq(clk_out)
        released = Signal(init=1)
        m.submodules.reset = AsyncFFSynchronizer(~locked, released, o_domain=self.domain)
        m.submodules.reset_buffer = Instance("DCCA", i_CLKI=released, i_CE=Const(1),
                                             o_CLKO=ResetSignal(self.domain))
        return m
