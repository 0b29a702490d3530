"""flex_attention's kernel_options: the CUDA kernel choices of one call,
checked by the runtime's parser (pagedc/KernelOptions.h) whatever the device,
and never taken from the PAGEDC_* environment variables."""
import re

import numpy as np
import pytest

import pagedc
from conftest import assert_close, randn, reference_attention

CAUSAL = "mask causal(b, h, q, kv) = q >= kv\n"
NAMES = ("prefill_shape, prefill_persistent, prefill_persistent_ctas, prefill_tile_counter, "
         "prefill_tma, prefill_tma_runs, prefill_pingpong, decode_split_factor, decode_splits, "
         "decode_merge_chunks, decode_tma, decode_tma_runs, link_mods")


def causal(b, h, q, kv):
    return q >= kv


def call(rng, **kwargs):
    q, k, v = randn(rng, 1, 2, 9, 8), randn(rng, 1, 2, 9, 8), randn(rng, 1, 2, 9, 8)
    out = pagedc.flex_attention(q, k, v, mods=pagedc.compile(CAUSAL), **kwargs)
    return q, k, v, out


def test_names_are_the_runtimes():
    assert ", ".join(pagedc.KERNEL_OPTIONS) == NAMES


def test_valid_options_leave_a_cpu_call_as_it_is(rng):
    options = {"prefill_shape": "128x64x64", "prefill_persistent": True,
               "prefill_persistent_ctas": 3, "prefill_tile_counter": False,
               "prefill_tma": False, "prefill_tma_runs": "0", "prefill_pingpong": 1,
               "decode_split_factor": 2, "decode_splits": None, "decode_merge_chunks": 4,
               "decode_tma": None, "decode_tma_runs": False,
               "link_mods": True}
    q, k, v, out = call(rng, kernel_options=options)
    assert_close(out, reference_attention(q, k, v, causal)[0])
    _, _, _, empty = call(rng, kernel_options={})
    assert empty.shape == out.shape


def test_unknown_key_names_it_and_lists_the_valid_ones(rng):
    with pytest.raises(ValueError, match="prefill_tmaa") as raised:
        call(rng, kernel_options={"prefill_tmaa": True})
    assert NAMES in str(raised.value)
    # The environment variable's name is not an option name.
    with pytest.raises(ValueError, match="PAGEDC_PREFILL_TMA"):
        call(rng, kernel_options={"PAGEDC_PREFILL_TMA": 0})


@pytest.mark.parametrize("name, value, message", [
    ("prefill_tma", 2, "kernel option prefill_tma is '2': expected 1 (" ),
    ("prefill_pingpong", "yes", "kernel option prefill_pingpong is 'yes': expected 1 ("),
    ("decode_split_factor", 17, "kernel option decode_split_factor is '17': expected an "
                                "integer from 1 to 16"),
    ("decode_splits", 0, "kernel option decode_splits is '0': expected an integer from 1 to "
                         "1024"),
    ("decode_merge_chunks", 3, "kernel option decode_merge_chunks is '3': expected 1, 2, 4, 8 "
                               "or 16"),
    ("prefill_persistent_ctas", 0, "kernel option prefill_persistent_ctas is '0': expected "
                                   "an integer from 1 to 1048576"),
    ("prefill_shape", "big", "kernel option prefill_shape 'big' is not MxNxW, MxNxWr or "
                             "MxNxW[sK][c2]"),
    ("prefill_persistent", "maybe", "kernel option prefill_persistent is 'maybe': expected 1 ("),
])
def test_bad_values_list_what_is_valid(rng, name, value, message):
    with pytest.raises(pagedc.Error, match=re.escape(message)):
        call(rng, kernel_options={name: value})


def test_bad_types_and_pairs(rng):
    with pytest.raises(ValueError, match=r"kernel_options\['decode_tma'\]: expected a bool, int, "
                                         r"str or None, got float"):
        call(rng, kernel_options={"decode_tma": 1.0})
    with pytest.raises(ValueError, match="kernel_options: expected a dict"):
        call(rng, kernel_options=["prefill_tma=0"])
    with pytest.raises(pagedc.Error, match="kernel option prefill_persistent_ctas is '3' but "
                                           "kernel option prefill_persistent is not 1"):
        call(rng, kernel_options={"prefill_persistent_ctas": 3})
    with pytest.raises(pagedc.Error, match="kernel option decode_splits is '4' and kernel option "
                                           "decode_split_factor is '2': give the split count or "
                                           "its factor, not both"):
        call(rng, kernel_options={"decode_splits": 4, "decode_split_factor": 2})


def test_environment_variables_do_not_apply(rng, monkeypatch):
    # A value the parser would refuse: the call never reads it.
    monkeypatch.setenv("PAGEDC_PREFILL_TMA", "garbage")
    monkeypatch.setenv("PAGEDC_PREFILL_SHAPE", "big")
    q, k, v, out = call(rng)
    assert_close(out, reference_attention(q, k, v, causal)[0])
