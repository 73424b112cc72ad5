"""The `ptocube asm`, `ptocube disasm` and `ptocube decode` commands, run in-process."""

import io
import json
import sys

import pytest

from ptocube.sim.cli import main

EX5 = """# EX5: TMATMUL S8 with post-processing
BSTART.TMATMUL S8
B.DATR {NORM, S8, Zero, EQ, RNE, 1, 0}
B.FPATR 3, LReLU, 2, 1, 1, 0, 1, 0, 0
B.DIM zero, 16, ->LB0
C.B.DIMI 64, ->LB1
B.DIM zero, 256, ->LB2
B.IOT M#1, N#1, mask=1111, ->T<4>
B.IOT mask=1111, ->U<1>
B.IOT mask=1111, last, ->N<2>
B.IOR a0, a1
BSTOP
"""
EX5_WORDS = ["0x98031181", "0x05309023", "0x0d16a023", "0x01000043", "0x503c", "0x10002043",
             "0xc2024e13", "0x0000ee93", "0x00096f93", "0x00310013", "0x00000001"]
EX5_BYTES = bytes.fromhex("81 11 03 98 23 90 30 05 23 a0 16 0d 43 00 00 01 3c 50 43 20 00 10 "
                          "13 4e 02 c2 93 ee 00 00 93 6f 09 00 13 00 31 00 01 00 00 00")


@pytest.fixture
def ex5(tmp_path):
    path = tmp_path / "ex5.s"
    path.write_text(EX5)
    return path


def set_stdin(monkeypatch, data: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


# -- asm ---------------------------------------------------------------------------------

def test_asm_prints_one_word_per_line(ex5, capsys):
    assert main(["asm", str(ex5)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == EX5_WORDS and err == ""


def test_asm_output_file_and_binary_image(ex5, tmp_path, capsys):
    out_path = tmp_path / "ex5.hex"
    assert main(["asm", str(ex5), "-o", str(out_path)]) == 0
    assert out_path.read_text().splitlines() == EX5_WORDS
    bin_path = tmp_path / "ex5.bin"
    assert main(["asm", str(ex5), "--bin", "-o", str(bin_path)]) == 0
    assert bin_path.read_bytes() == EX5_BYTES
    assert capsys.readouterr().out == ""


def test_asm_binary_to_stdout(ex5, capsysbinary):
    assert main(["asm", str(ex5), "--bin"]) == 0
    assert capsysbinary.readouterr().out == EX5_BYTES


def test_asm_reads_stdin(monkeypatch, capsys):
    set_stdin(monkeypatch, b"BSTART.SFU TIMG2COL, FP16; BSTOP\n")
    assert main(["asm", "-"]) == 0
    assert capsys.readouterr().out == "0x26419181\n0x00000001\n"


@pytest.mark.parametrize("source,location,message", [
    ("BSTART.TMATMUL FP16\nB.FOO 1\n", "2:1", "unknown mnemonic 'B.FOO'"),
    ("B.DIM zero, 16\n", "1:15", "missing operand: B.DIM expects RegSrc, uimm17, ->LBn"),
    ("C.B.DIMI 300, ->LB0\n", "1:10", "value 300 out of range for imm8 (0..255)"),
    ("BSTOP\nB.IOT T#1, mask=0110, last\n", "2:12", "unencodable PE mask 0110"),
])
def test_asm_errors_go_to_stderr_with_exit_2_and_no_output_file(tmp_path, capsys, source,
                                                                 location, message):
    src = tmp_path / "bad.s"
    src.write_text(source)
    out_path = tmp_path / "out.hex"
    assert main(["asm", str(src), "-o", str(out_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{src}:{location}: {message}")
    assert err.count("\n") == 1
    assert not out_path.exists()


def test_asm_error_on_stdin_names_stdin(monkeypatch, capsys):
    set_stdin(monkeypatch, b"BSTART.TMATMUL\n")
    assert main(["asm", "-"]) == 2
    assert capsys.readouterr().err.startswith("<stdin>:1:15: missing operand")


def test_asm_missing_file(tmp_path, capsys):
    assert main(["asm", str(tmp_path / "nope.s")]) == 2
    assert "cannot read" in capsys.readouterr().err


# -- disasm --------------------------------------------------------------------------------

def test_disasm_round_trip(ex5, tmp_path, capsys):
    words = tmp_path / "ex5.hex"
    assert main(["asm", str(ex5), "-o", str(words)]) == 0
    assert main(["disasm", str(words)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines() == [line for line in EX5.splitlines() if not line.startswith("#")]
    again = tmp_path / "again.s"
    again.write_text(text)
    assert main(["asm", str(again)]) == 0
    assert capsys.readouterr().out.splitlines() == EX5_WORDS


def test_disasm_binary_input(ex5, tmp_path, capsys):
    image = tmp_path / "ex5.bin"
    image.write_bytes(EX5_BYTES)
    assert main(["disasm", "--bin", str(image)]) == 0
    assert capsys.readouterr().out.splitlines()[4] == "C.B.DIMI 64, ->LB1"


def test_disasm_illegal_words_print_raw_with_fault_and_exit_0(monkeypatch, capsys):
    set_stdin(monkeypatch, b"# words\n0x78031181\n\n0xfffc\n0x00007013\n0x0000\n")
    assert main(["disasm", "-"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(".4byte 0x78031181  # Fault_IllegalInstruction:")
    assert lines[1].startswith(".2byte 0xfffc  # Fault_IllegalInstruction:")
    assert lines[2].startswith(".4byte 0x00007013  # Fault_IllegalInstruction:")
    assert lines[3] == "C.BSTOP"


def test_disasm_malformed_listing(monkeypatch, capsys):
    set_stdin(monkeypatch, b"0x20031181\n0x2003118\n")
    assert main(["disasm", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("<stdin>:2:1: expected 0x and 4, 8, 12 or 16 hex digits")


def test_disasm_truncated_binary(tmp_path, capsys):
    image = tmp_path / "cut.bin"
    image.write_bytes(EX5_BYTES[:6])
    assert main(["disasm", "--bin", str(image)]) == 2
    assert "ends inside a 32-bit instruction" in capsys.readouterr().err


# -- decode --------------------------------------------------------------------------------

def test_decode_prints_records_as_json(ex5, tmp_path, capsys):
    words = tmp_path / "ex5.hex"
    main(["asm", str(ex5), "-o", str(words)])
    assert main(["decode", str(words)]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["outcome"] == "ok" and record["bundle"]["dims"] == [16, 64, 256]


def test_decode_assembly_with_gprs(tmp_path, capsys):
    src = tmp_path / "dim.s"
    src.write_text("BSTART.TMATMUL FP16\nB.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n"
                   "B.DIM a0, 7, ->LB0\nBSTOP\nBSTOP\n")
    assert main(["decode", "--asm", str(src), "--gpr", "a0=5"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records[0]["bundle"]["dims"] == [12, None, None]
    assert records[1]["outcome"] == "Fault_BundleControl" and records[1]["fault_index"] == 4


def test_decode_binary_to_file(tmp_path, capsys):
    image = tmp_path / "ex5.bin"
    image.write_bytes(EX5_BYTES)
    out_path = tmp_path / "ex5.json"
    assert main(["decode", "--bin", str(image), "-o", str(out_path)]) == 0
    assert json.loads(out_path.read_text())[0]["bundle"]["op"] == "TMATMUL"


def test_decode_errors(tmp_path, capsys):
    src = tmp_path / "bad.s"
    src.write_text("BSTART.TMATMUL FP99\n")
    assert main(["decode", "--asm", str(src)]) == 2
    assert capsys.readouterr().err.startswith(f"{src}:1:16: expected a DataType")
    with pytest.raises(SystemExit) as exit_:
        main(["decode", str(src), "--gpr", "q9=1"])
    assert exit_.value.code == 2
    assert "expected REG=VALUE" in capsys.readouterr().err
