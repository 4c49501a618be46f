"""A replay of ggml's graph allocator, for the compute buffer llama.cpp reserves.

llama.cpp sizes its compute buffer by building the worst-case graph (n_ubatch tokens) and
letting ggml-alloc place every intermediate tensor (ggml/src/ggml-alloc.c): leafs and
inputs first, then the nodes in order, each one reusing its parent's memory when the op
allows it (in place), and memory going back to a best-fit free list as soon as a tensor's
last consumer has run. The buffer is the highest offset that placement ever reaches, so it
depends on the order of the graph, not only on its biggest tensors: a sum of "the largest
live tensors" misses by 5-20%. This module has the few ggml ops the graphs need (shapes,
strides, views) and runs the same placement, to the byte; build.py builds the graphs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# fmt: off
# element types: name -> (elements per block, bytes per block), as in ggml.h
TYPE_SIZES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "i32": (1, 4), "i64": (1, 8), "q8_0": (32, 34),
    "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18),
}
INPUT, OUTPUT = 1, 2  # GGML_TENSOR_FLAG_INPUT, GGML_TENSOR_FLAG_OUTPUT
# ggml_op_can_inplace() in ggml-alloc.c (UNARY covers SILU, GELU, TANH...)
INPLACE_OPS = frozenset({
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV", "SQR",
    "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "CLAMP",
    "SOFT_MAX", "SOFT_MAX_BACK",
})
# fmt: on


def row_size(dtype: str, n: int) -> int:
    block, size = TYPE_SIZES[dtype]
    return n // block * size


def pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass(eq=False)
class Tensor:
    """What ggml-alloc looks at: shape and strides, sources, view source, flags."""

    op: str
    dtype: str
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    src: tuple[Tensor, ...] = ()
    view_src: Tensor | None = None
    view_offs: int = 0
    flags: int = 0
    external: bool = False  # has its own buffer (weights, KV cache): never placed here
    name: str = ""

    @property
    def nbytes(self) -> int:
        return row_size(self.dtype, self.ne[0]) * self.ne[1] * self.ne[2] * self.ne[3]

    def layout(self) -> tuple[object, ...]:
        return (self.dtype, self.ne, self.nb)


def _strides(dtype: str, ne: Sequence[int]) -> tuple[int, int, int, int]:
    b0 = TYPE_SIZES[dtype][1]
    b1 = row_size(dtype, ne[0])
    return (b0, b1, b1 * ne[1], b1 * ne[1] * ne[2])


def _ne4(ne: Sequence[int]) -> tuple[int, int, int, int]:
    full = [*ne, 1, 1, 1][:4]
    return (full[0], full[1], full[2], full[3])


class Ctx:
    """The few ggml ops the graphs use, with ggml's shape rules (ggml.c)."""

    def new(
        self,
        dtype: str,
        ne: Sequence[int],
        op: str = "NONE",
        src: Iterable[Tensor | None] = (),
        flags: int = 0,
        name: str = "",
    ) -> Tensor:
        """A tensor of this shape the allocator places: the result of op on src (None sources left out)."""
        n4 = _ne4(ne)
        srcs = tuple(s for s in src if s is not None)
        return Tensor(op, dtype, n4, _strides(dtype, n4), srcs, flags=flags, name=name)

    def input(self, dtype: str, ne: Sequence[int], name: str = "") -> Tensor:
        return self.new(dtype, ne, flags=INPUT, name=name)

    def weight(self, ne: Sequence[int], dtype: str = "f32", name: str = "") -> Tensor:
        """A tensor with its own buffer (a weight, the KV cache): never placed in the compute buffer."""
        n4 = _ne4(ne)
        return Tensor("NONE", dtype, n4, _strides(dtype, n4), external=True, name=name)

    def view(
        self, a: Tensor, ne: Sequence[int], nb: Sequence[int] = (), offs: int = 0, op: str = "VIEW"
    ) -> Tensor:
        """ggml_view_Nd (nb = nb1.. as given, the rest packed) or, without nb, a reshape."""
        n4 = _ne4(ne)
        if nb:
            full = [TYPE_SIZES[a.dtype][1], *nb]
            while len(full) < 4:
                full.append(full[-1] * n4[len(full) - 1])
            nb4 = _ne4(full)
        else:
            nb4 = _strides(a.dtype, n4)
        return Tensor(op, a.dtype, n4, nb4, (a,), a.view_src or a, a.view_offs + offs)

    def reshape(self, a: Tensor, *ne: int) -> Tensor:
        return self.view(a, ne, op="RESHAPE")

    def permute(self, a: Tensor, *axes: int) -> Tensor:
        ne, nb = [0] * 4, [0] * 4
        for i, ax in enumerate(axes):
            ne[ax], nb[ax] = a.ne[i], a.nb[i]
        return Tensor("PERMUTE", a.dtype, _ne4(ne), _ne4(nb), (a,), a.view_src or a, a.view_offs)

    def transpose(self, a: Tensor) -> Tensor:
        return self.permute(a, 1, 0, 2, 3)

    def unary(self, op: str, a: Tensor, *more: Tensor | None) -> Tensor:
        """An op whose result has a's shape: norm, mul, add, rope, scale, softmax, glu..."""
        return self.new("f32" if a.dtype not in ("f32", "f16") else a.dtype, a.ne, op, (a, *more))

    def mul_mat(self, w: Tensor, x: Tensor) -> Tensor:
        return self.new("f32", (w.ne[1], x.ne[1], x.ne[2], x.ne[3]), "MUL_MAT", (w, x))

    def get_rows(self, a: Tensor, ids: Tensor) -> Tensor:
        return self.new(
            "i32" if a.dtype == "i32" else "f32",
            (a.ne[0], ids.ne[0], ids.ne[1], ids.ne[2]),
            "GET_ROWS",
            (a, ids),
        )

    def cont(self, a: Tensor, ne: Sequence[int] | None = None) -> Tensor:
        return self.new(a.dtype, ne or a.ne, "CONT", (a,))

    def cpy(self, a: Tensor, dst: Tensor) -> Tensor:
        """ggml_cpy(): a view of dst that a is copied into."""
        return Tensor("CPY", dst.dtype, dst.ne, dst.nb, (a, dst), dst.view_src or dst, dst.view_offs)

    def set_rows(self, dst: Tensor, x: Tensor, ids: Tensor) -> Tensor:
        return Tensor(
            "SET_ROWS", dst.dtype, dst.ne, dst.nb, (x, ids, dst), dst.view_src or dst, dst.view_offs
        )


@dataclass
class Graph:
    """ggml_cgraph: nodes and leafs in the order ggml_build_forward_expand() visits them."""

    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    _seen: set[int] = field(default_factory=set)

    def expand(self, t: Tensor) -> Tensor:
        # iterative form of ggml_visit_parents_graph(): sources first, in order
        stack: list[tuple[Tensor, int]] = [(t, 0)]
        if id(t) in self._seen:
            return t
        self._seen.add(id(t))
        while stack:
            cur, i = stack.pop()
            if i < len(cur.src):
                stack.append((cur, i + 1))
                s = cur.src[i]
                if id(s) not in self._seen:
                    self._seen.add(id(s))
                    stack.append((s, 0))
                continue
            (self.leafs if cur.op == "NONE" else self.nodes).append(cur)
        return t


class _Allocator:
    """ggml_dyn_tallocr: one chunk, best-fit free blocks, the last block unbounded."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = []  # [offset, size], sorted by offset
        self.max_size = 0
        self.started = False

    def alloc(self, size: int) -> int:
        size = pad(size, self.alignment)
        if not self.started:
            self.started = True
            self.blocks = [[0, 1 << 62]]
        best, best_size = -1, None
        for i, (_, bsize) in enumerate(self.blocks[:-1]):
            if bsize >= size and (best_size is None or bsize <= best_size):
                best, best_size = i, bsize
        if best == -1:
            best = len(self.blocks) - 1
        block = self.blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def free(self, offset: int, size: int) -> None:
        size = pad(size, self.alignment)
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:
                block[1] += size
                if i < len(blocks) - 1 and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


@dataclass
class _Info:
    n_children: int = 0
    n_views: int = 0
    allocated: bool = False
    offset: int = 0


def compute_buffer_size(graph: Graph, alignment: int = 32) -> int:
    """The size ggml_gallocr_reserve() gives the buffer for this graph (one backend)."""
    alloc = _Allocator(alignment)
    info: dict[int, _Info] = {}

    def hn(t: Tensor) -> _Info:
        return info.setdefault(id(t), _Info())

    def allocate(t: Tensor) -> None:
        h = hn(t)
        if t.external or h.allocated or t.view_src is not None:
            return
        h.allocated = True
        if t.op in INPLACE_OPS:
            for p in t.src:
                ph = hn(p)
                if (
                    not ph.allocated
                    or p.flags & OUTPUT
                    or (p.view_src is not None and p.view_src.flags & OUTPUT)
                ):
                    continue
                if p.layout() != t.layout() or ph.n_children != 1 or ph.n_views != 0:
                    continue
                if p.view_src is not None:
                    vh = hn(p.view_src)
                    if not (vh.n_views == 1 and vh.n_children == 0 and p.view_offs == 0):
                        continue
                    owner, oh = p.view_src, vh
                    ph.allocated = False
                else:
                    owner, oh = p, ph
                h.offset = oh.offset
                oh.allocated = False
                extra = pad(owner.nbytes, alignment) - pad(t.nbytes, alignment)
                if extra > 0:
                    alloc.free(oh.offset + pad(t.nbytes, alignment), extra)
                return
        h.offset = alloc.alloc(t.nbytes)

    def free(t: Tensor) -> None:
        if t.flags & OUTPUT:
            return
        h = hn(t)
        alloc.free(h.offset, t.nbytes)
        h.allocated = False

    for leaf in graph.leafs:
        allocate(leaf)
    for node in graph.nodes:
        if node.view_src is not None:
            hn(node.view_src).n_views += 1
        if node.flags & INPUT:
            allocate(node)
        for s in node.src:
            hn(s).n_children += 1
            if s.flags & INPUT:
                allocate(s)
    for node in graph.nodes:
        for p in node.src:
            allocate(p)
        allocate(node)
        for p in node.src:
            ph = hn(p)
            ph.n_children -= 1
            if ph.n_children == 0 and ph.n_views == 0:
                if p.view_src is not None:
                    vh = hn(p.view_src)
                    vh.n_views -= 1
                    if vh.n_views == 0 and vh.n_children == 0 and vh.allocated:
                        free(p.view_src)
                elif ph.allocated:
                    free(p)
    return alloc.max_size
