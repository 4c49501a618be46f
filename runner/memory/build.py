"""The worst-case graphs llama_context reserves at creation, for graph.py's allocator replay.

build_graph() adds the nodes in the order llama.cpp's graph builders add them
(llama-graph.cpp, src/models/<arch>.cpp), because the placement, and so the buffer size,
depends on that order. Exact graphs: llama (and llama3 rope factors), deci, qwen2, qwen3,
qwen2moe, qwen3moe, gemma2, gemma3 (sliding window), mamba, jamba (hybrid). Other transformer
architectures get the llama graph with their own sizes: close, not exact (Estimate.exact
is False).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.memory.arch import Hparams
from runner.memory.graph import OUTPUT, Ctx, Graph, Tensor


@dataclass(frozen=True)
class GraphParams:
    """What llama_context::graph_reserve() builds a graph for."""

    n_tokens: int
    n_seqs: int
    n_outputs: int
    n_kv: int  # cells per stream of the main cache (n_ctx_seq)
    n_kv_swa: int  # cells per stream of the sliding-window cache
    n_stream: int
    flash_attn: bool
    v_trans: bool
    type_k: str = "f16"
    type_v: str = "f16"
    rot_k: int = 0  # size of the Hadamard rotation for quantized K (0: none)
    rot_v: int = 0


@dataclass
class _Attn:
    k_idxs: Tensor
    v_idxs: Tensor
    mask: Tensor
    n_kv: int


def rotation_sizes(hp: Hparams, type_k: str, type_v: str) -> tuple[int, int]:
    """The Hadamard rotations llama.cpp applies to a quantized K or V cache (llama-kv-cache.cpp:
    319-338, 1447-1486): K when every layer has the same head size, a multiple of 64 (the
    largest power of two dividing it), V when its head size is a multiple of 64 (64)."""
    plain = ("f32", "f16", "bf16")
    heads = {hp.head_k_swa if hp.is_swa[il] else hp.head_k for il in hp.attn_layers()}
    head_k = heads.pop() if len(heads) == 1 else 0
    rot_k = 0
    if type_k not in plain and head_k > 0 and head_k % 64 == 0:
        rot_k = 64
        while head_k % (rot_k * 2) == 0:
            rot_k *= 2
    rot_v = 64 if type_v not in plain and hp.head_v > 0 and hp.head_v % 64 == 0 else 0
    return rot_k, rot_v


class _Builder:
    """One llm_graph_context: the shared pieces of llama.cpp's decoder graphs."""

    def __init__(self, hp: Hparams, gp: GraphParams) -> None:
        self.hp, self.gp = hp, gp
        self.c, self.g = Ctx(), Graph()
        self.style = hp.arch if hp.exact_graph else "llama"
        self.gemma = self.style in ("gemma2", "gemma3")
        self.s_copy = self.c.input("i32", (gp.n_seqs,))  # build_rs_inp(): a state per sequence when reserving

    def w(self, *ne: int) -> Tensor:
        return self.c.weight(ne)

    def norm(self, x: Tensor, kind: str = "RMS_NORM") -> Tensor:
        return self.c.unary("MUL", self.c.unary(kind, x), self.w(x.ne[0]))

    def attn_inputs(self, n_kv: int) -> _Attn:
        c, gp, hp, t = self.c, self.gp, self.hp, self.gp.n_tokens
        v_rows = t * max(hp.n_embd_v_gqa(il) for il in range(hp.n_layer)) if gp.v_trans else t
        mask = c.input("f16" if gp.flash_attn else "f32", (n_kv, t // gp.n_stream, 1, gp.n_stream))
        return _Attn(c.input("i64", (t,)), c.input("i64", (v_rows,)), mask, n_kv)

    def rotate(self, x: Tensor, rot: Tensor) -> Tensor:
        """llama_mul_mat_hadamard()."""
        c, n = self.c, rot.ne[0]
        flat = c.reshape(x, n, x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3] // n)
        return c.reshape(c.mul_mat(rot, flat), *x.ne)

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor, a: _Attn, rot: tuple) -> Tensor:
        """build_attn(): store K and V, attend over the cache, project out."""
        c, g, gp, hp = self.c, self.g, self.gp, self.hp
        rot_k, rot_v = rot
        if rot_k is not None:
            q, k = self.rotate(q, rot_k), self.rotate(k, rot_k)
        if rot_v is not None:
            v = self.rotate(v, rot_v)
        g.expand(q)
        for t in (k, v) if hp.swa_any else (v, k):
            g.expand(t)
        n_kv, ns, t_seq = a.n_kv, gp.n_stream, gp.n_tokens // gp.n_stream
        hd_k, hd_v, n_head, n_head_kv = k.ne[0], v.ne[0], q.ne[1], k.ne[1]
        kc = c.weight((hd_k * n_head_kv, n_kv, ns), gp.type_k)
        vc = c.weight((hd_v * n_head_kv, n_kv, ns), gp.type_v)
        kc2 = c.reshape(kc, hd_k * n_head_kv, n_kv * ns) if ns > 1 else kc
        g.expand(c.set_rows(kc2, c.view(k, (hd_k * n_head_kv, gp.n_tokens), (k.nb[2],)), a.k_idxs))
        if not gp.v_trans:
            vc2 = c.reshape(vc, hd_v * n_head_kv, n_kv * ns) if ns > 1 else vc
            g.expand(c.set_rows(vc2, c.view(v, (hd_v * n_head_kv, gp.n_tokens), (v.nb[2],)), a.v_idxs))
        else:  # transposed V: one row per element, padded to the widest layer (llama-kv-cache.cpp:1385-1410)
            width = max(hp.n_embd_v_gqa(i) for i in range(hp.n_layer))
            v2 = c.reshape(v, hd_v * n_head_kv, gp.n_tokens)
            if hd_v * n_head_kv < width:
                v2 = c.new(v2.dtype, (width, gp.n_tokens), "PAD", (v2,))
            vflat = c.reshape(vc, 1, width * n_kv * ns)
            g.expand(c.set_rows(vflat, c.reshape(v2, 1, v2.ne[0] * gp.n_tokens), a.v_idxs))
        kv = c.view(kc, (hd_k, n_head_kv, n_kv, ns), (1, 1, 1))
        vv = c.view(vc, (n_kv, n_head_kv, hd_v, ns) if gp.v_trans else (hd_v, n_head_kv, n_kv, ns), (1, 1, 1))
        q4 = c.view(q, (q.ne[0], n_head, t_seq, ns), (q.nb[1], q.nb[2], q.nb[2] * t_seq))
        qp, kp, vp = (c.permute(x, 0, 2, 1, 3) for x in (q4, kv, vv))
        if gp.flash_attn:
            if gp.v_trans:
                vp = c.transpose(vp)
            out = c.new("f32", (hd_v, n_head, t_seq, ns), "FLASH_ATTN_EXT", (qp, kp, vp, a.mask))
            cur = c.reshape(out, hd_v * n_head, gp.n_tokens)
        else:
            kq = c.mul_mat(kp, qp)
            if self.style == "gemma2":
                kq = c.unary("SCALE", c.unary("UNARY", c.unary("SCALE", kq)))
            kq = c.unary("SOFT_MAX", kq, a.mask)
            if not gp.v_trans:
                vp = c.cont(c.transpose(vp), (vp.ne[1], vp.ne[0], vp.ne[2], vp.ne[3]))
            kqv = c.mul_mat(vp, kq)
            cur = c.cont(c.permute(kqv, 0, 2, 1, 3), (hd_v * n_head, gp.n_tokens))
        g.expand(cur)
        if rot_v is not None:
            cur = self.rotate(cur, rot_v)
        cur = c.mul_mat(self.w(hd_v * n_head, hp.n_embd), cur)
        if hp.has(f"blk.{il}.attn_output.bias"):
            cur = c.unary("ADD", cur, self.w(hp.n_embd))
        return cur

    def qkv(self, il: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """build_qkv(): separate Q, K, V projections (optional biases), reshaped to heads."""
        c, hp, t = self.c, self.hp, self.gp.n_tokens
        hd_k = hp.head_k_swa if hp.is_swa[il] else hp.head_k
        hd_v = hp.head_v_swa if hp.is_swa[il] else hp.head_v
        n_head, n_head_kv = hp.n_head[il], hp.n_head_kv[il]
        if hp.has(f"blk.{il}.attn_qkv.weight"):
            qkv = c.mul_mat(self.w(hp.n_embd, hd_k * (n_head + n_head_kv) + hd_v * n_head_kv), x)
            row = qkv.nb[1]
            q = c.view(qkv, (hd_k, n_head, t), (hd_k * 4, row))
            k = c.view(qkv, (hd_k, n_head_kv, t), (hd_k * 4, row), hd_k * n_head * 4)
            v = c.view(qkv, (hd_v, n_head_kv, t), (hd_v * 4, row), hd_k * (n_head + n_head_kv) * 4)
            return q, k, v
        out = []
        for name, rows in (("q", hd_k * n_head), ("k", hd_k * n_head_kv), ("v", hd_v * n_head_kv)):
            y = c.mul_mat(self.w(hp.n_embd, rows), x)
            if hp.has(f"blk.{il}.attn_{name}.bias"):
                y = c.unary("ADD", y, self.w(rows))
            out.append(y)
        q, k, v = out
        return (
            c.reshape(q, hd_k, n_head, t),
            c.reshape(k, hd_k, n_head_kv, t),
            c.reshape(v, hd_v, n_head_kv, t),
        )

    def ffn(self, il: int, x: Tensor) -> Tensor:
        c, hp = self.c, self.hp
        if hp.n_expert and hp.has(f"blk.{il}.ffn_gate_inp.weight"):
            return self.moe(il, x)
        n_ff = hp.n_ff[il]
        up = c.mul_mat(self.w(hp.n_embd, n_ff), x)
        gate = c.mul_mat(self.w(hp.n_embd, n_ff), x)
        cur = c.new("f32", gate.ne, "GLU", (gate, up))
        return c.mul_mat(self.w(n_ff, hp.n_embd), cur)

    def moe(self, il: int, x: Tensor) -> Tensor:
        """build_moe_ffn() with softmax gating and normalized weights, plus qwen2moe's shared expert."""
        c, g, hp, t = self.c, self.g, self.hp, x.ne[1]  # n_outputs in the last layer
        n_exp, k, n_ff = hp.n_expert, hp.n_expert_used, hp.n_ff_exp or hp.n_ff[il]
        logits = c.mul_mat(self.w(hp.n_embd, n_exp), x)
        probs = c.unary("SOFT_MAX", logits)
        argsort = c.new("i32", probs.ne, "ARGSORT", (probs,))
        selected = c.view(argsort, (k, t), (argsort.nb[1],))
        weights = c.get_rows(c.reshape(probs, 1, n_exp, t), selected)
        if self.style not in ("qwen2moe", "jamba"):  # norm_w
            w2 = c.reshape(weights, k, t)
            total = c.unary("CLAMP", c.new("f32", (1, t), "SUM_ROWS", (w2,)))
            weights = c.reshape(c.unary("DIV", w2, total), 1, k, t)
        g.expand(weights)
        x3 = c.reshape(x, hp.n_embd, 1, t)
        up = c.new("f32", (n_ff, k, t), "MUL_MAT_ID", (self.w(hp.n_embd, n_ff, n_exp), x3, selected))
        gate = c.new("f32", (n_ff, k, t), "MUL_MAT_ID", (self.w(hp.n_embd, n_ff, n_exp), x3, selected))
        cur = c.new("f32", gate.ne, "GLU", (gate, up))
        experts = c.new(
            "f32", (hp.n_embd, k, t), "MUL_MAT_ID", (self.w(n_ff, hp.n_embd, n_exp), cur, selected)
        )
        experts = c.unary("MUL", experts, weights)
        g.expand(experts)
        views = [c.view(experts, (hp.n_embd, t), (experts.nb[2],), i * experts.nb[1]) for i in range(k)]
        for v in views:
            g.expand(v)
        out = views[0]
        for v in views[1:]:
            out = g.expand(c.unary("ADD", out, v))
        if k == 1:
            out = c.cont(out)
        if hp.has(f"blk.{il}.ffn_up_shexp.weight"):
            n_sh = hp.n_ff_shexp or n_ff
            gate_inp = c.mul_mat(self.w(hp.n_embd, 1), x) if self.style == "qwen2moe" else None
            up = c.mul_mat(self.w(hp.n_embd, n_sh), x)
            gate = c.mul_mat(self.w(hp.n_embd, n_sh), x)
            sh = c.mul_mat(self.w(n_sh, hp.n_embd), c.new("f32", gate.ne, "GLU", (gate, up)))
            if gate_inp is not None:  # sigmoid as silu(x) / x (models/qwen2moe.cpp:150)
                sh = c.unary("MUL", sh, c.unary("DIV", c.unary("UNARY", gate_inp), gate_inp))
            out = g.expand(c.unary("ADD", out, sh))
        return out

    def recurrent_state(self, s: Tensor, size: int, rows) -> Tensor:
        """build_rs(): zero one state, gather the sequences' states, copy the others back."""
        c, g, n_s, n_rs = self.c, self.g, self.gp.n_seqs, self.gp.n_seqs
        states = c.reshape(s, size, s.ne[1])
        g.expand(c.view(c.view(states, (size,)), (size,), op="SCALE"))
        out = g.expand(rows(states, c.view(self.s_copy, (n_s,))))
        extra = c.get_rows(states, c.view(self.s_copy, (n_rs - n_s,), offs=n_s * 4))
        g.expand(c.cpy(extra, c.view(s, (size, n_rs - n_s), (s.nb[1],))))
        return out

    def mamba(self, il: int, x: Tensor) -> Tensor:
        """build_mamba_layer() (models/mamba-base.cpp): conv state, conv, selective scan."""
        c, g, hp = self.c, self.g, self.hp
        d_conv, d_inner, d_state, dt_rank = hp.ssm
        n_s = self.gp.n_seqs
        n_t, n_rs = self.gp.n_tokens // n_s, n_s
        conv_all = c.weight((hp.n_embd_r, n_rs))
        ssm_all = c.weight((hp.n_embd_s, n_rs))
        conv = self.recurrent_state(conv_all, hp.n_embd_r, c.get_rows)
        conv = c.reshape(conv, d_conv - 1, d_inner, n_s)
        xz = c.mul_mat(self.w(hp.n_embd, 2 * d_inner), c.reshape(x, hp.n_embd, n_t, n_s))
        xs = c.view(xz, (d_inner, n_t, n_s), (xz.nb[1], xz.nb[2]))
        z = c.view(xz, (d_inner, n_t, n_s), (xz.nb[1], xz.nb[2]), d_inner * 4)
        conv_x = c.new("f32", (d_conv - 1 + n_t, d_inner, n_s), "CONCAT", (conv, c.transpose(xs)))
        last = c.view(conv_x, (d_conv - 1, d_inner, n_s), (conv_x.nb[1], conv_x.nb[2]), n_t * 4)
        g.expand(c.cpy(last, c.view(conv_all, ((d_conv - 1) * d_inner * n_s,))))
        xs = c.new("f32", (d_inner, n_t, n_s), "SSM_CONV", (conv_x, self.w(d_conv, d_inner)))
        xs = c.unary("UNARY", c.unary("ADD", xs, self.w(d_inner)))
        x_db = c.mul_mat(self.w(d_inner, dt_rank + 2 * d_state), xs)
        strides = (d_state * 4, x_db.nb[1], x_db.nb[2])
        b_ = c.view(x_db, (d_state, 1, n_t, n_s), strides, dt_rank * 4)
        c_ = c.view(x_db, (d_state, 1, n_t, n_s), strides, (dt_rank + d_state) * 4)
        dt = c.view(x_db, (dt_rank, n_t, n_s), (x_db.nb[1], x_db.nb[2]))
        if hp.has(f"blk.{il}.ssm_dt_norm.weight"):  # jamba, falcon-mamba: RMS norms on dt, B, C
            dt, b_, c_ = self.norm(dt), self.norm(b_), self.norm(c_)
        else:
            dt = c.cont(dt)
        dt = c.unary("ADD", c.mul_mat(self.w(dt_rank, d_inner), dt), self.w(d_inner))
        x4 = c.reshape(xs, 1, d_inner, n_t, n_s)

        def scan(states: Tensor, ids: Tensor) -> Tensor:
            s4 = c.reshape(states, d_state, 1, d_inner, n_rs)
            n = d_inner * n_t * n_s + d_state * d_inner * n_s
            return c.new("f32", (n,), "SSM_SCAN", (s4, x4, dt, self.w(d_state, d_inner), b_, c_, ids))

        y_ssm = self.recurrent_state(ssm_all, hp.n_embd_s, scan)
        n_state = d_state * d_inner * n_s
        g.expand(c.cpy(c.view(y_ssm, (n_state,), offs=x4.nb[3] * n_s), c.view(ssm_all, (n_state,))))
        y = c.view(y_ssm, (d_inner, n_t, n_s), (x4.nb[2], x4.nb[3]))
        y = c.unary("ADD", y, c.unary("MUL", xs, self.w(d_inner)))
        zc = c.cont(z)
        y = c.new("f32", zc.ne, "GLU", (zc, y))
        cur = c.mul_mat(self.w(d_inner, hp.n_embd), y)
        return c.reshape(cur, hp.n_embd, n_t * n_s)


def build_graph(hp: Hparams, gp: GraphParams) -> Graph:
    """The decoder graph llama.cpp reserves, for the transformer architectures and mamba."""
    b = _Builder(hp, gp)
    c, g, t = b.c, b.g, gp.n_tokens
    tok = c.weight((hp.n_embd, hp.n_vocab_out), name="token_embd")
    x = c.get_rows(tok, c.input("i32", (t,)))
    g.expand(x)
    g.expand(c.input("f32", (hp.n_embd, t)))  # the embeddings-input branch of ggml_build_forward_select
    if b.gemma:
        x = c.unary("SCALE", x)
    pos = c.input("i32", (t,))
    base = b.attn_inputs(gp.n_kv)
    swa = b.attn_inputs(gp.n_kv_swa) if hp.swa_any else base
    rots = [
        (
            c.input("f32", (gp.rot_k, gp.rot_k)) if gp.rot_k else None,
            c.input("f32", (gp.rot_v, gp.rot_v)) if gp.rot_v else None,
        )
        for _ in range(2)
    ]
    out_ids = c.input("i32", (gp.n_outputs,))
    qk_norm = b.style in ("qwen3", "qwen3moe", "gemma3") or hp.has("blk.0.attn_q_norm.weight")
    last = hp.n_layer - 1
    for il in range(hp.n_layer):
        inp = x
        if b.style == "mamba" or (b.style == "jamba" and hp.n_head_kv[il] == 0):
            cur = b.mamba(il, b.norm(x))
        elif b.style == "jamba":  # attention without RoPE
            q, k, v = b.qkv(il, b.norm(x))
            cur = b.attention(il, q, k, v, base, rots[0])
        elif hp.n_head[il] == 0:  # deci: attention-free layer
            cur = x
        else:
            cur = b.norm(x)
            if hp.n_head_kv[il] == 0:
                cur = c.mul_mat(b.w(hp.n_embd, hp.n_embd), cur)
            else:
                q, k, v = b.qkv(il, cur)
                if qk_norm:
                    q = c.unary("ROPE", b.norm(q), pos)
                    k = c.unary("ROPE", b.norm(k), pos)
                else:
                    q, k = c.unary("ROPE", q, pos), c.unary("ROPE", k, pos)
                if b.gemma:
                    q = c.unary("SCALE", q)
                cur = b.attention(il, q, k, v, swa if hp.is_swa[il] else base, rots[hp.is_swa[il]])
        if il == last:
            cur, inp = c.get_rows(cur, out_ids), c.get_rows(inp, out_ids)
        if b.gemma:
            cur = b.norm(cur)
        if b.style == "mamba":
            x = c.unary("ADD", cur, inp)
            continue
        if b.style == "jamba":  # the residual first: it is the one reused in place
            ffn_inp = c.unary("ADD", inp, cur)
            x = c.unary("ADD", ffn_inp, b.ffn(il, b.norm(ffn_inp)))
            continue
        if hp.n_ff[il] == 0 and not hp.n_expert:
            continue  # deci: an FFN-free layer leaves x as it was (models/deci.cpp:148)
        ffn_inp = c.unary("ADD", cur, inp) if hp.n_head[il] else cur
        cur = b.ffn(il, b.norm(ffn_inp))
        if b.gemma:
            cur = b.norm(cur)
        x = c.unary("ADD", cur, ffn_inp)
    x = b.norm(x)
    x.flags |= OUTPUT
    out = tok if not hp.has("output.weight") else c.weight((hp.n_embd, hp.n_vocab_out))
    logits = c.mul_mat(out, x)
    if hp.final_softcap:
        logits = c.unary("SCALE", c.unary("UNARY", c.unary("SCALE", logits)))
    logits.flags |= OUTPUT
    g.expand(logits)
    return g
