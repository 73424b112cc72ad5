"""Instruction streams for decoder tests (test-only): random bundles and parcel beats.

Shared by ``tests/test_hdl_decoder.py`` (the hardware decoder against the model's) and
``tests/test_verilator.py`` (the same streams through Verilator and pysim).
"""

from ptocube.model import isa
from ptocube.sim.bench_decoder import FORMS_BY_ROLE as _BY_ROLE
from ptocube.sim.bench_decoder import (consistent_fpatr, random_boundary, random_word,
                                       well_formed_bundle)

__all__ = ["beats_of", "random_command", "random_bundle", "random_raw_word", "random_streams",
           "random_gprs"]


def beats_of(streams, per_beat, rng=None):
    """Input beats for a list of instruction streams; each stream ends with a ``last`` beat.

    With ``rng``, beats carry a random number of parcels (0..per_beat), else full beats.
    """
    beats = []
    for words in streams:
        parcels = isa.words_to_parcels(words)
        i = 0
        while True:
            count = rng.randint(0, per_beat) if rng else per_beat
            chunk = parcels[i:i + count]
            i += len(chunk)
            last = i >= len(parcels) and (rng is None or rng.random() < 0.8)
            beats.append({"parcels": chunk + [0] * (per_beat - len(chunk)),
                          "count": len(chunk), "last": int(last)})
            if last:
                break
    return beats


def random_command(rng):
    """Any header command, binding, other command or raw word, with random fields."""
    kind = rng.random()
    if kind < 0.3:
        form = rng.choice(_BY_ROLE[isa.Role.IOT])
        fixed = {"PEMode": rng.choice([7, 7, 0, rng.randint(1, 6)])}
        return random_word(form, rng, **fixed)
    if kind < 0.42:
        return random_word(_BY_ROLE[isa.Role.IOS][0], rng, SharedTID=rng.randint(0, 5),
                           SizeCode=0 if rng.random() < 0.85 else rng.randint(1, 15))
    roles = [isa.Role.DIM, isa.Role.DIMI, isa.Role.DATR, isa.Role.FPATR, isa.Role.IOR,
             isa.Role.CATR, isa.Role.HINT, isa.Role.OTHER_COMMAND, isa.Role.STOP,
             isa.Role.MATRIX_START]
    if kind < 0.95:
        form = rng.choice(_BY_ROLE[rng.choice(roles)])
        fields = consistent_fpatr(rng) if form.role is isa.Role.FPATR else {}
        return random_word(form, rng, legal=0.9, **fields)
    return random_raw_word(rng)


def random_bundle(rng):
    """One bundle's words: well formed, well formed with a few mutations, or chaotic."""
    r = rng.random()
    if r < 0.75:
        words = well_formed_bundle(rng)
        if r > 0.35:
            for _ in range(rng.randint(1, 2)):
                mutation = rng.random()
                k = rng.randint(1, len(words))
                if mutation < 0.4 or len(words) < 3:
                    words.insert(k, random_command(rng))
                elif mutation < 0.6:
                    del words[k - 1 if k == len(words) else k]
                elif mutation < 0.8 and k < len(words) - 1:
                    words[k], words[k + 1] = words[k + 1], words[k]
                else:
                    word, length = words[k - 1]
                    form = isa.find_form(word, length)
                    if form is not None and isa.length_of(form.match & 0xFFFF) == form.length:
                        words[k - 1] = random_word(form, rng, legal=0.8)
        return words
    words = []
    r = rng.random()
    if r < 0.6:
        words.append(random_word(rng.choice(_BY_ROLE[isa.Role.MATRIX_START]), rng))
    elif r < 0.75:
        words.append(random_word(_BY_ROLE[isa.Role.TEPL_START][0], rng, Mode=3, Function=4))
    elif r < 0.82:
        words.append(random_word(_BY_ROLE[isa.Role.TEPL_START][0], rng))
    elif r < 0.92:
        words.append(random_word(rng.choice(_BY_ROLE[isa.Role.OTHER_START] +
                                            _BY_ROLE[isa.Role.TRACE_START]), rng))
    words += [random_command(rng) for _ in range(rng.randint(0, 9))]
    return words + random_boundary(rng)


def random_raw_word(rng):
    """Any instruction: random bits whose first parcel fixes the length (ruling R15)."""
    first = rng.getrandbits(16)
    length = isa.length_of(first)
    return first | (rng.getrandbits(length - 16) << 16 if length > 16 else 0), length


def random_streams(rng, bundles):
    """Streams of 1..5 random bundles each, ``bundles`` bundles in all."""
    streams = []
    while bundles > 0:
        n = min(bundles, rng.randint(1, 5))
        bundles -= n
        streams.append([w for _ in range(n) for w in random_bundle(rng)])
    return streams


def random_gprs(rng):
    """GPR0 zero and 23 random 32-bit values (the decoder reads the low 16 bits)."""
    return [0] + [rng.getrandbits(32) for _ in range(23)]
