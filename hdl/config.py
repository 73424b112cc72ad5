"""Elaboration parameters of the CUBE unit, in one object passed down the hierarchy.

Every hardware component takes a :class:`CubeConfig` (or the part of it it needs) instead of
reading globals, so one preset fixes the whole unit: array size, which numeric type classes are
built, tile-store size and the decoder's bounds.  A type class that a build omits is rejected by
the preflight with ``Fault_TileLegality`` before any effect (an *implementation profile*, see
``docs/spec-decisions.md``).
"""

from dataclasses import dataclass, replace

__all__ = ["CubeConfig", "PRESETS", "preset"]


@dataclass(frozen=True)
class CubeConfig:
    """Parameters of one CUBE unit build.

    rows, cols:        systolic array size (processing elements).
    int_types:         build the integer MAC path (S16/S8/S4, U16/U8/U4 inputs).
    float_types:       build the FP32 fused multiply-add path (ordinary float inputs).
    mx_types:          build MX scaling (E8M0 scales; requires float_types).
    fma_stages:        pipeline depth of the FP32 FMA; hidden by interleaving outputs per PE.
    int_product_register: integer-only builds: register the product between the DSP
                       multiplier and the accumulator; the accumulation loop stays one
                       cycle (L = 1), results reach the chain registers a cycle later.
    dsp_primitives:    None: the PE multiplier is Amaranth's ``*`` (any tool).  "ecp5": with
                       int_product_register, an explicit MULT18X18D whose own input and
                       output registers are the operand and product registers (yosys'
                       synth_ecp5 does not pack registers into it); elaborated for an ECP5
                       platform only, elsewhere (the simulator) as its behavioural model
                       (hdl/int_mac.py, docs/decisions/fpga.md F47).
    serial_lane_feed:  the lane path (the runs the operand buffers cannot take: Shared or
                       transposed primaries, MX scales, floating Bias) gathers a beat one
                       lane at a time (hdl/serial_feed.py), R + C cycles or more a beat,
                       instead of all lanes at once (hdl/operand_feed.py): for builds short
                       of logic.
    panel_words_outreg: ECP5 builds: the panel feed's word registers become the panel block
                       RAMs' output registers (F44).  False keeps them in the fabric
                       (FABRIC_REGISTER, docs/decisions/fpga.md F48): each word bit feeds
                       the element shifters, and from the RAM's own outputs those loads
                       crowd the routing around the RAM rows.
    tile_bytes_per_pe: payload memory of the Local tile store for each of the four PEs.
    shared_bytes:      payload memory of the Shared tiles S0..S255 (all of them together).
    max_local_sources, max_destinations, max_shared, max_iot_words:
                       decoder bounds; the defaults are spec-complete for Matrix bundles.
    """

    rows: int = 4
    cols: int = 4
    int_types: bool = True
    float_types: bool = True
    mx_types: bool = True
    fma_stages: int = 3
    int_product_register: bool = False
    dsp_primitives: str | None = None
    serial_lane_feed: bool = False
    panel_words_outreg: bool = True
    tile_bytes_per_pe: int = 64 * 1024
    shared_bytes: int = 64 * 1024
    max_local_sources: int = 8
    max_destinations: int = 3
    max_shared: int = 4
    max_iot_words: int = 16

    def __post_init__(self):
        if self.rows < 1 or self.cols < 1:
            raise ValueError("the systolic array needs at least one row and one column")
        if not (self.int_types or self.float_types):
            raise ValueError("a build must support at least one numeric type class")
        if self.mx_types and not self.float_types:
            raise ValueError("MX scaling needs the floating-point path (float_types=True)")
        if self.tile_bytes_per_pe % 128 or self.shared_bytes % 128:
            raise ValueError("the tile store holds whole 128-byte CELLs")

    def with_(self, **changes) -> "CubeConfig":
        """A copy with some parameters changed."""
        return replace(self, **changes)


PRESETS = {
    # Full type support on a small array: the default for simulation and tests.
    "sim-small": CubeConfig(rows=4, cols=4),
    # Integer-only 8x8 array for the ECP5-85F, using its DSP multipliers with the product
    # registered before the accumulator (docs/decisions/fpga.md, F19), in the DSP blocks'
    # own registers (F47).
    # The lane path (Shared and transposed primaries) one lane at a time, to save logic
    # (docs/decisions/hdl-cube.md, decision 21).  The panel feed's word registers stay
    # in the fabric: with them in the panel RAMs the 8x8 unit stopped routing (F48).
    "ecp5-int8": CubeConfig(rows=8, cols=8, float_types=False, mx_types=False,
                            int_product_register=True, dsp_primitives="ecp5",
                            serial_lane_feed=True, panel_words_outreg=False,
                            tile_bytes_per_pe=16 * 1024, shared_bytes=16 * 1024),
    # The ecp5-int8 unit with a 4x4 array (and every lane of the lane path at once): the
    # whole unit routes on the ECP5-85F with nextpnr's static placer (docs/fpga-history.md,
    # sessions 10 and 11).
    "ecp5-int4": CubeConfig(rows=4, cols=4, float_types=False, mx_types=False,
                            int_product_register=True, dsp_primitives="ecp5",
                            tile_bytes_per_pe=16 * 1024, shared_bytes=16 * 1024),
    # All type classes on a 2x2 array for the ECP5-85F: one full-type PE takes about
    # 2,800 logic cells, so a 4x4 array alone would fill 54 % of the device (docs/fpga.md).
    # The lane path one lane at a time: all at once it packs to 9,732 logic cells, four
    # times the serial path's 2,401, and the unit stopped routing (docs/decisions/fpga.md,
    # F42).
    "ecp5-full": CubeConfig(rows=2, cols=2, serial_lane_feed=True,
                            tile_bytes_per_pe=16 * 1024, shared_bytes=16 * 1024),
    # Integer-only 2x2 array, the smallest build, meant for the iCE40 UP5K; the whole unit
    # does not fit that device yet (docs/fpga.md, "Breakdown by component").
    "ice40-tiny": CubeConfig(rows=2, cols=2, float_types=False, mx_types=False,
                             tile_bytes_per_pe=2 * 1024, shared_bytes=2 * 1024),
}


def preset(name: str) -> CubeConfig:
    """Look up a named preset; the error lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None
