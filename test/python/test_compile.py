"""pagedc.compile: sources, selection, defines and located diagnostics."""
import os
from pathlib import Path

import numpy as np
import pytest

import pagedc
from conftest import SOURCE_DIR, assert_close, randn, reference_attention


def test_compile_path_and_file_name():
    path = Path(SOURCE_DIR) / "examples" / "mods.attn"
    if not path.exists():
        pytest.skip("examples/mods.attn not in this checkout")
    listed = path.read_text()
    mods = pagedc.compile(path, mask="causal")
    assert mods.mask == "causal" and mods.score is None
    assert mods.source == listed and mods.file_name == str(path)
    again = pagedc.compile(str(path), mask="causal")
    assert again.mask == "causal"


def test_single_mods_are_selected_and_ambiguity_is_an_error():
    mods = pagedc.compile("mask a(b, h, q, kv) = q >= kv\nscore s(s, b, h, q, kv) = s * 2.0\n")
    assert (mods.mask, mods.score) == ("a", "s")
    with pytest.raises(ValueError, match="2 mask mods"):
        pagedc.compile("mask a(b, h, q, kv) = q >= kv\nmask c(b, h, q, kv) = q <= kv\n")
    only_score = pagedc.compile("mask a(b, h, q, kv) = q >= kv\nmask c(b, h, q, kv) = true\n"
                                "score s(s, b, h, q, kv) = s\n", score="s")
    assert only_score.mask is None and only_score.score == "s"


def test_defines_override_constants(rng):
    src = "const W = 1000\nmask window(b, h, q, kv) = (q >= kv) & (q - kv <= W)\n"
    mods = pagedc.compile(src, defines={"W": 2})
    q, k, v = randn(rng, 1, 1, 8, 8), randn(rng, 1, 1, 8, 8), randn(rng, 1, 1, 8, 8)
    ref = reference_attention(q, k, v, lambda b, h, qq, kv: (qq >= kv) & (qq - kv <= 2))[0]
    assert_close(pagedc.flex_attention(q, k, v, mods=mods), ref)
    with pytest.raises(pagedc.CompileError, match="no constant named 'X'"):
        pagedc.compile(src, defines={"X": 1})
    with pytest.raises(ValueError, match="defines"):
        pagedc.compile(src, defines={"W": [1]})


def test_compile_error_carries_location():
    src = "const WINDOW = 4\n\nmask m(b, h, q, kv) = q - kv <= WINDOWS\n"
    with pytest.raises(pagedc.CompileError) as info:
        pagedc.compile(src)
    e = info.value
    assert (e.file, e.line, e.column) == ("<string>", 3, 33)
    assert "unknown name 'WINDOWS'" in e.message and "did you mean 'WINDOW'" in e.message
    assert e.source_line == "mask m(b, h, q, kv) = q - kv <= WINDOWS"
    assert e.caret.index("^") == 32
    assert "<string>:3:33: error:" in str(e)


def test_compile_error_file_and_several_errors(tmp_path):
    path = tmp_path / "bad.attn"
    path.write_text("mask a(b, h, q, kv) = q $ kv\nmask c(b, h, q, kv) = x\n")
    with pytest.raises(pagedc.CompileError) as info:
        pagedc.compile(path)
    assert info.value.file == str(path) and info.value.line == 1
    assert info.value.diagnostics.count("error:") >= 2


def test_missing_mod_and_unreadable_source(tmp_path):
    with pytest.raises(pagedc.CompileError, match="nope"):
        pagedc.compile("mask a(b, h, q, kv) = true\n", mask="nope")
    with pytest.raises(ValueError, match="source"):
        pagedc.compile(tmp_path / "missing.attn")
    with pytest.raises(ValueError, match="source"):
        pagedc.compile(42)


LIMIT = 16 << 20  # the documented maximum program size (docs/language.md)


def test_program_size_is_bounded(tmp_path):
    # Every kind of file over the limit is refused naming the file and the
    # limit, without reading it whole: a sparse regular file one byte over
    # (measured, never read), endless devices (counted while read).
    big = tmp_path / "big.attn"
    with open(big, "wb") as f:
        f.truncate(LIMIT + 1)
    for path in (big, Path("/dev/zero"), Path("/dev/urandom")):
        with pytest.raises(ValueError, match=r"program '%s' is larger than 16 MiB "
                           r"\(16777216 bytes\)" % path):
            pagedc.compile(path)
    # A file of exactly the limit is read (a comment, then a mod).
    mod = "\nmask a(b, h, q, kv) = q >= kv\n"
    exact = tmp_path / "exact.attn"
    exact.write_text("#" + "x" * (LIMIT - 1 - len(mod)) + mod)
    assert exact.stat().st_size == LIMIT
    assert pagedc.compile(exact).mask == "a"
    # Text handed over in memory is held to the same limit.
    with pytest.raises(pagedc.CompileError, match="larger than 16 MiB"):
        pagedc.compile("#" + "x" * LIMIT + mod)
    # A directory is a clear error too.
    with pytest.raises(ValueError, match="source: cannot read"):
        pagedc.compile(tmp_path)


def test_cuda_codegen_flag():
    if pagedc.cuda_codegen_available():
        mods = pagedc.compile("mask a(b, h, q, kv) = q >= kv\n", cuda=True)
        assert mods.has_cuda
    else:
        with pytest.raises(ValueError, match="cuda"):
            pagedc.compile("mask a(b, h, q, kv) = q >= kv\n", cuda=True)
    assert not pagedc.compile("mask a(b, h, q, kv) = q >= kv\n").has_cuda


def test_examples_corpus_compiles():
    examples = Path(SOURCE_DIR) / "examples"
    files = sorted(examples.glob("*.attn"))
    if not files:
        pytest.skip("no examples/*.attn")
    for path in files[:8]:
        text = path.read_text()
        try:
            pagedc.compile(path)
        except ValueError as e:  # several mods of a kind: select the first of each
            assert "select one" in str(e)
