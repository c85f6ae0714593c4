"""attention_ext: the entry point of the attention extras of MPNet, ModernBERT and the decoder
architectures: relative-position bias, RoPE, local window, causal mask, grouped KV heads, q/k
RMSNorm. They are constexpr switches of the one varlen
attention kernel (kernels/attention.py: same tile table, grid, online softmax and numerics);
this is its launch with the tables required.
"""

from __future__ import annotations

from zoi.backends.cuda.kernels.attention import launch_attention


def launch_attention_ext(
    qkv,
    hdr,
    cu,
    tcum,
    o,
    amax,
    T_bucket,
    n_seq,
    heads,
    head_dim,
    scale,
    bias=None,
    cos=None,
    sin=None,
    window=0,
    cfg=None,
    pdl=False,
    kv_heads=0,
    causal=False,
    q_norm=None,
    k_norm=None,
    qk_eps=1e-6,
):
    """attention.launch_attention with the extras: bias fp32 [heads, 2P-1], cos / sin fp32
    [P, head_dim/2], window (0: global), kv_heads (0: heads), causal, q_norm / k_norm fp32
    [head_dim] (qk_eps). cfg: attention.pick_config's dict for the bucket."""
    launch_attention(
        qkv, hdr, cu, tcum, o, amax, T_bucket, n_seq, heads, head_dim, scale,
        cfg=cfg, pdl=pdl, bias=bias, cos=cos, sin=sin, window=window, kv_heads=kv_heads,
        causal=causal, q_norm=q_norm, k_norm=k_norm, qk_eps=qk_eps,
    )  # fmt: skip
