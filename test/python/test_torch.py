"""Comparisons with torch.nn.attention.flex_attention (f32, CPU, <= 1e-4) and
the torch-function spellings of the gallery mods. Every test here needs
PyTorch and is reported SKIPPED (with the reason) without it."""
import numpy as np
import pytest

import pagedc

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(scripts/python-torch-tests.sh installs it in a venv)")
flex = pytest.importorskip("torch.nn.attention.flex_attention",
                           reason="this PyTorch has no flex_attention")

B, H, S, D = 2, 4, 64, 16


def _torch_flex(q, k, v, mask_mod=None, score_mod=None):
    block_mask = None
    if mask_mod is not None:
        block_mask = flex.create_block_mask(mask_mod, B, H, S, S, device="cpu")
    return flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                               return_lse=True)


doc = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), S // 4)
slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32))
prefix = torch.tensor([5, 40])


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


GALLERY = {
    "causal": (causal, None),
    "sliding": (lambda b, h, q, kv: (q >= kv) & (q - kv <= 8), None),
    "prefix_lm": (flex.or_masks(lambda b, h, q, kv: kv <= prefix[b], causal), None),
    "document": (lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv), None),
    "alibi": (causal, lambda s, b, h, q, kv: s + slopes[h] * (kv - q)),
    "softcap": (None, lambda s, b, h, q, kv: 2.0 * torch.tanh(s / 2.0)),
    "relative": (None, lambda s, b, h, q, kv: s + (q - kv)),
    "where_clamp": (None, lambda s, b, h, q, kv: torch.where(q >= kv, torch.clamp(s, -1, 1),
                                                              torch.sigmoid(s))),
    "and_masks": (flex.and_masks(causal, lambda b, h, q, kv: torch.abs(q - kv) % 3 != 1), None),
}


@pytest.mark.parametrize("name", sorted(GALLERY))
def test_traced_gallery_matches_pytorch(name):
    mask_mod, score_mod = GALLERY[name]
    mods = pagedc.from_torch(mask_mod=mask_mod, score_mod=score_mod)
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    out, lse = pagedc.flex_attention(q, k, v, mods=mods, return_lse=True)
    ref, ref_lse = _torch_flex(q, k, v, mask_mod, score_mod)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


def test_unsupported_torch_function_is_named():
    with pytest.raises(pagedc.TraceError, match="torch.atan"):
        pagedc.from_torch(score_mod=lambda s, b, h, q, kv: torch.atan(s))


def test_gqa_matches_pytorch():
    q = torch.randn(1, 8, 32, 16)
    k, v = torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16)
    mods = pagedc.from_torch(mask_mod=causal)
    out = pagedc.flex_attention(q, k, v, mods=mods, enable_gqa=True)
    bm = flex.create_block_mask(causal, 1, 8, 32, 32, device="cpu")
    ref = flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
