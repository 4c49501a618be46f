"""An audio projector ("mmproj" with an audio encoder) checked from its header before libmtmd ever
opens it.

The pinned libmtmd (tools/mtmd/clip.cpp, models/whisper-enc.cpp, models/qwen3a.cpp) trusts the file,
and a malformed audio projector aborts or crashes the process: a missing a.position_embd (a NULL
dereference), fewer than 1500 positions (GGML_ASSERT at the first clip), clip.audio.num_mel_bins of
another GGUF type (gguf's getter aborts) or disagreeing with the first convolution's input channels,
an epsilon that is not f32, position embeddings that are not f32 (ggml-cpu's add aborts at the first
clip), a Q/V bias missing or a K bias present (whisper-enc.cpp asserts both), 1-D convolution biases,
a transposed projection; and an ultravox or voxtral encoder whose width and stack factor make the
frame stacking's padding come out one row off, which aborts at the first clip: build_stack (clip.cpp)
rounds with GGML_PAD, a bit mask right only for a power-of-two stride, so the window's rows are
checked as it computes them (stacked_rows). With ultravox's 8, widths 32, 48, 64, 96, 512, 768 and
1024 abort (measured against llama-server for the small ones); whisper-large's 1280, the real
files', and the test projectors' 40 do not. So check_audio_projector compares the header with what
clip.cpp reads for ultravox, voxtral, qwen2a (Qwen2-Audio's), qwen2.5o (Qwen2.5-Omni's, with
check_omni_projector for its vision half) and qwen3a (Qwen3-ASR's: three 2-D convolutions whose
kernels' channels ggml asserts), refuses everything else in one line (InvalidModelFile, naming the
file), and says what a clip costs (AudioProjectorInfo).

libmtmd cuts a clip into 30-second windows (3000 mel frames of 10 ms; a 30.0 s clip already takes
two) and each window becomes one audio chunk of `window_tokens` embeddings: 3000 frames halved by
the second convolution (1500 positions), then stacked by stack_factor (ultravox, voxtral: padded up
to a multiple of it) or pooled by 2 (qwen2a, qwen2.5o, voxtral). qwen3a's windows are 8 s (800
frames), each cut into 1-second chunks of 13 embeddings, so a clip costs 13 tokens a started second.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runner.gguf.header import GGUFHeader, TensorInfo
from runner.gguf.projector import Check, ProjectorInfo, check_projector

AUDIO_SUPPORTED = ("ultravox", "voxtral", "qwen2a", "qwen2.5o", "qwen3a")
STACKED = ("ultravox", "voxtral")  # clip.audio.projector.stack_factor required (clip.cpp 1803)
POOLED = ("voxtral", "qwen2a")  # nn.AvgPool1d(2): half the positions (clip-model.h audio_has_avgpool)
# Qwen2.5-Omni's one file with both encoders: clip.cpp reads its type as qwen2a for the audio one
# and qwen2.5vl_merger for the vision one (load_hparams, clip.cpp 1292)
OMNI = {"qwen2.5o": ("qwen2a", "qwen2.5vl_merger")}
WINDOW_SECONDS = 30  # hparams.audio_chunk_len
WINDOW_FRAMES = 3000  # mel frames of one window (hop 160 at 16 kHz)
N_POS = WINDOW_FRAMES // 2  # positions after the stride-2 convolution: a.position_embd needs as many rows
SAMPLE_RATE = 16_000  # hparams.audio_sample_rate of these types
# qwen3a (Qwen3-ASR's, models/qwen3a.cpp): windows of 800 mel frames (mtmd-audio.cpp 700), each cut
# into chunks of 100 frames (1 s) that three stride-2 convolutions make 13 positions of
QWEN3A_WINDOW, QWEN3A_CHUNK, QWEN3A_CHUNK_TOKENS = 800, 100, 13
VECTOR = frozenset({"F32"})
MATRIX = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"})
CONV = frozenset({"F32", "F16"})

# Every key clip.cpp reads for an audio projector of these types, with the GGUF type its getter asserts
# fmt: off
AUDIO_KEYS: dict[str, tuple[str, bool]] = {
    "general.name":                            ("str", False),
    "general.description":                     ("str", False),
    "clip.has_audio_encoder":                  ("bool", True),
    "clip.has_gen_audio_encoder":              ("bool", False),
    "clip.use_gelu":                           ("bool", False),  # read for every modality, then
    "clip.use_silu":                           ("bool", False),  # overridden (GELU for these types)
    "clip.vision.mm_patch_merge_type":         ("str", False),   # read for every modality too
    "clip.has_vision_encoder":                 ("bool", False),
    "clip.projector_type":                     ("str", False),
    "clip.audio.projector_type":               ("str", False),
    "clip.audio.num_mel_bins":                 ("u32", True),
    "clip.audio.embedding_length":             ("u32", True),
    "clip.audio.attention.head_count":         ("u32", True),
    "clip.audio.attention.head_count_kv":      ("u32", False),
    "clip.audio.attention.head_dim":           ("u32", False),
    "clip.audio.feed_forward_length":          ("u32", True),
    "clip.audio.block_count":                  ("u32", True),
    "clip.audio.projection_dim":               ("u32", True),
    "clip.audio.attention.layer_norm_epsilon": ("f32", True),
    "clip.audio.projector.stack_factor":       ("u32", False),
}
# fmt: on


@dataclass(frozen=True)
class AudioProjectorInfo:
    """What a clip costs through this projector."""

    projector_type: str  # one of AUDIO_SUPPORTED
    n_mel: int
    width: int  # the encoder's
    heads: int
    blocks: int
    n_ff: int
    stack: int  # frames stacked into one embedding (0: none)
    window_tokens: int  # embeddings one 30-second window becomes
    projection_width: int  # each embedding's width: the text model's n_embd
    weights_bytes: int
    sample_rate: int = SAMPLE_RATE

    def windows(self, seconds: float) -> int:
        """The windows libmtmd cuts a clip of `seconds` into: 30-second ones (30.0 s is two: its last
        frame); qwen3a's of 8 s (frames: a sample's every 10 ms and one more)."""
        if self.projector_type == "qwen3a":
            return -(-qwen3a_frames(seconds) // QWEN3A_WINDOW)
        return int(seconds // WINDOW_SECONDS) + 1

    def clip_tokens(self, seconds: float) -> int:
        if self.projector_type == "qwen3a":  # each window's frames in whole chunks of 13 tokens
            frames = qwen3a_frames(seconds)
            full, rest = divmod(frames, QWEN3A_WINDOW)
            chunks = full * (QWEN3A_WINDOW // QWEN3A_CHUNK) + -(-rest // QWEN3A_CHUNK)
            return chunks * QWEN3A_CHUNK_TOKENS
        return self.windows(seconds) * self.window_tokens

    def per_minute(self) -> str:
        if self.projector_type == "qwen3a":
            return (
                f"{self.clip_tokens(60):,} audio tokens a minute of audio (13 for each second a clip starts)"
            )
        return (
            f"{self.clip_tokens(59.9):,} audio tokens a minute of audio ({self.window_tokens:,} every 30 s)"
        )


def qwen3a_frames(seconds: float) -> int:
    """The mel frames qwen3a's preprocessor keeps of a clip (mtmd-audio.cpp 694: n_samples / hop + 1)."""
    return int(seconds * SAMPLE_RATE) // 160 + 1


def is_audio_projector(header: GGUFHeader) -> bool:
    """An audio projector (an audio encoder and no vision encoder): check_audio_projector's to check."""
    meta = header.metadata
    return meta.get("clip.has_audio_encoder") is True and meta.get("clip.has_vision_encoder") is not True


def is_omni_projector(header: GGUFHeader) -> bool:
    """A projector with both encoders (Qwen2.5-Omni's): check_omni_projector's to check."""
    meta = header.metadata
    return meta.get("clip.has_audio_encoder") is True and meta.get("clip.has_vision_encoder") is True


@dataclass(frozen=True)
class OmniProjectorInfo:
    """A file with both encoders: what an image costs through one, a clip through the other."""

    vision: ProjectorInfo
    audio: AudioProjectorInfo

    @property
    def projector_type(self) -> str:
        return self.audio.projector_type


def check_omni_projector(
    header: GGUFHeader, types: Mapping[str, str], *, text_n_embd: int | None = None
) -> OmniProjectorInfo:
    """Both halves of a projector with both encoders, each against what clip.cpp reads for the type
    it makes of the file's (OMNI): the audio encoder here, the vision one by runner.gguf.projector."""
    meta, c = header.metadata, _Check(header, types)
    kind = c.key("clip.projector_type")  # a string, or absent: its type checked first
    if kind not in OMNI:
        named = (
            repr(kind)
            if kind
            else " and ".join(
                f"{meta.get(f'clip.{part}.projector_type')!r} for {part}" for part in ("vision", "audio")
            )
        )
        c.fail(
            f"it has both a vision and an audio encoder, its projector type {named}; runner takes "
            f"both in one file only as {', '.join(OMNI)} (Qwen2.5-Omni's)"
        )
    audio = check_audio_projector(header, types, text_n_embd=text_n_embd)
    vision = check_projector(header, text_n_embd, key_types=types, omni=True)
    return OmniProjectorInfo(vision, audio)


class _Check(Check):
    """A projector's check (runner.gguf.projector) with the audio encoder's keys and bounds."""

    what = "audio projector"

    def __init__(self, header: GGUFHeader, types: Mapping[str, str]) -> None:
        super().__init__(header, types)
        self.keys = AUDIO_KEYS

    def bound(self, key: str, value: int) -> None:
        if not 0 < value < 1 << 20:
            self.fail(f"{key} is {value}, out of the range clip.cpp's graph can take")

    def tensor(
        self, name: str, shape: tuple[int, ...], types: frozenset[str], required: bool = True
    ) -> TensorInfo:
        found = super().tensor(name, shape, types)  # required: a missing one failed
        assert found is not None
        return found

    def absent(self, name: str, why: str) -> None:
        if name in self.by_name:
            self.fail(f"it has a tensor {name}, {why}")


def check_audio_projector(
    header: GGUFHeader, types: Mapping[str, str], *, text_n_embd: int | None = None
) -> AudioProjectorInfo:
    """The header of an audio projector against what clip.cpp reads for its type; `types`: each key's
    GGUF type (runner.gguf.projector.read_key_types)."""
    c = _Check(header, types)
    if c.key("clip.has_audio_encoder") is not True:
        c.fail("clip.has_audio_encoder is not true: it has no audio encoder")
    for key in AUDIO_KEYS:
        c.key(key)  # every type, before any value is used
    named = c.key("clip.projector_type") or c.key("clip.audio.projector_type") or ""
    if named not in AUDIO_SUPPORTED:
        c.fail(
            f"its projector type {named!r} is not one runner takes audio through "
            f"({', '.join(AUDIO_SUPPORTED)})"
        )
    kind = OMNI[named][0] if named in OMNI else named  # the graph clip.cpp builds
    mel, e, heads = (
        c.key("clip.audio.num_mel_bins"),
        c.key("clip.audio.embedding_length"),
        c.key("clip.audio.attention.head_count"),
    )
    ff, blocks = c.key("clip.audio.feed_forward_length"), c.key("clip.audio.block_count")
    proj = c.key("clip.audio.projection_dim")
    c.key("clip.audio.attention.layer_norm_epsilon")
    for key in ("clip.audio.attention.head_count_kv", "clip.audio.attention.head_dim"):
        if c.key(key) not in (None, heads if key.endswith("kv") else e // heads):
            c.fail(f"{key} differs from what a whisper encoder has")
    if mel > 256:
        c.fail(f"clip.audio.num_mel_bins is {mel}: libmtmd takes 1 to 256")
    if e % heads:
        c.fail(f"its width {e} is not a multiple of its {heads} heads")
    stack = c.key("clip.audio.projector.stack_factor") or 0
    if kind in STACKED:
        if not stack:
            c.fail(f"a {kind} projector needs clip.audio.projector.stack_factor")
        rows, expected = stacked_rows(e, stack), -(-WINDOW_FRAMES // stack) // 2
        if rows != expected:
            c.fail(
                f"its encoder width {e} with stack factor {stack} makes libmtmd's frame stacking give "
                f"{rows} rows a window where it expects {expected} (it aborts at the first clip)"
            )
    elif stack:
        c.fail(f"clip.audio.projector.stack_factor is given, which a {kind} projector has none of")
    if kind == "qwen3a":
        out = _check_qwen3a(c, mel, e, ff, blocks, text_n_embd or proj)
    else:
        _check_encoder(c, mel, e, ff, blocks)
        out = _check_projection(c, kind, e, stack, text_n_embd or proj)
    if text_n_embd is not None and out != text_n_embd:
        c.fail(
            f"it projects into width {out}, the model's embeddings are {text_n_embd} wide: "
            "is it this model's?"
        )
    return AudioProjectorInfo(
        projector_type=named,
        n_mel=mel,
        width=e,
        heads=heads,
        blocks=blocks,
        n_ff=ff,
        stack=stack,
        window_tokens=window_tokens(kind, stack),
        projection_width=out,
        weights_bytes=sum(t.nbytes for t in header.tensors),
    )


def stacked_rows(width: int, stack: int) -> int:
    """The rows build_stack (clip.cpp) makes of a window's 1500 positions: its padded length rounded
    by GGML_PAD, `(x + n - 1) & ~(n - 1)`, which is only a multiple of n where n is a power of two."""
    total, stride = N_POS * width, width * stack
    return ((total + stride - 1) & ~(stride - 1)) // stride


def window_tokens(kind: str, stack: int) -> int:
    """The embeddings one 30-second window becomes (clip_n_output_tokens): its 3000 frames stacked
    by `stack` (padded up to a multiple of it), halved by the second convolution, pooled by 2;
    qwen3a's 8-second window, 8 chunks of 13."""
    if kind == "qwen3a":
        return QWEN3A_WINDOW // QWEN3A_CHUNK * QWEN3A_CHUNK_TOKENS
    tokens = -(-WINDOW_FRAMES // stack) if stack else WINDOW_FRAMES
    tokens //= 2
    return tokens // 2 if kind in POOLED else tokens


def _positions(c: _Check, e: int, least: int) -> None:
    """a.position_embd.weight: [e, `least` or more], F32 (added to F32 activations, repeated first for
    qwen3a: ggml-cpu aborts on F16 at the first clip); missing, the graph reads a null tensor."""
    pos = c.by_name.get("a.position_embd.weight")
    if pos is None:
        c.fail("it has no tensor a.position_embd.weight")
    if len(pos.shape) != 2 or pos.shape[0] != e or pos.shape[1] < least:
        c.fail(
            f"tensor a.position_embd.weight has shape {list(pos.shape)}, "
            f"clip.cpp's graph needs [{e}, {least} or more]"
        )
    if pos.type_name not in VECTOR:
        c.fail(f"tensor a.position_embd.weight is {pos.type_name}; it takes F32 (the converter's)")


def _check_encoder(c: _Check, mel: int, e: int, ff: int, blocks: int) -> None:
    """The whisper encoder's convolutions, positions and blocks (models/whisper-enc.cpp)."""
    c.tensor("a.conv1d.1.weight", (3, mel, e), CONV)
    c.tensor("a.conv1d.1.bias", (1, e), VECTOR)
    c.tensor("a.conv1d.2.weight", (3, e, e), CONV)
    c.tensor("a.conv1d.2.bias", (1, e), VECTOR)
    _positions(c, e, N_POS)
    _check_blocks(c, e, ff, blocks)
    if "a.post_ln.weight" in c.by_name:
        c.tensor("a.post_ln.weight", (e,), VECTOR)
        c.tensor("a.post_ln.bias", (e,), VECTOR)


def _check_blocks(c: _Check, e: int, ff: int, blocks: int) -> None:
    for i in range(blocks):
        blk = f"a.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            c.tensor(f"{blk}.{part}.weight", (e, e), MATRIX)
        for part in ("attn_q", "attn_v", "attn_out"):
            c.tensor(f"{blk}.{part}.bias", (e,), VECTOR)
        c.absent(f"{blk}.attn_k.bias", "which a whisper encoder has none of (libmtmd asserts it)")
        for norm in ("ln1", "ln2"):
            c.tensor(f"{blk}.{norm}.weight", (e,), VECTOR)
            c.tensor(f"{blk}.{norm}.bias", (e,), VECTOR)
        c.tensor(f"{blk}.ffn_up.weight", (e, ff), MATRIX)
        c.tensor(f"{blk}.ffn_up.bias", (ff,), VECTOR)
        c.tensor(f"{blk}.ffn_down.weight", (ff, e), MATRIX)
        c.tensor(f"{blk}.ffn_down.bias", (e,), VECTOR)
    c.absent(f"a.blk.{blocks}.attn_q.weight", f"past its clip.audio.block_count {blocks}")


def _check_projection(c: _Check, kind: str, e: int, stack: int, want: int) -> int:
    """The projection into the text model's width (its output width, as the file has it)."""
    if kind == "qwen2a":
        fc = c.by_name.get("mm.a.fc.weight")
        out = fc.shape[1] if fc is not None and len(fc.shape) == 2 and fc.shape[0] == e else want
        c.tensor("mm.a.fc.weight", (e, out), MATRIX)
        c.tensor("mm.a.fc.bias", (out,), VECTOR)
        return out
    stacked = e * stack
    up = c.by_name.get("mm.a.mlp.1.weight")
    hidden = up.shape[1] if up is not None and len(up.shape) == 2 and up.shape[0] == stacked else 0
    c.tensor("mm.a.mlp.1.weight", (stacked, hidden or want), MATRIX)
    down = c.by_name.get("mm.a.mlp.2.weight")
    n_in = hidden // 2 if kind == "ultravox" else hidden  # ultravox's SwiGLU halves the width
    if kind == "ultravox" and hidden % 2:
        c.fail(f"tensor mm.a.mlp.1.weight has an odd output width {hidden}: its SwiGLU halves it")
    out = down.shape[1] if down is not None and len(down.shape) == 2 and down.shape[0] == n_in else want
    c.tensor("mm.a.mlp.2.weight", (n_in, out), MATRIX)
    if kind == "ultravox":
        c.tensor("mm.a.norm_pre.weight", (stacked,), VECTOR)
        c.tensor("mm.a.norm_mid.weight", (n_in,), VECTOR)
    return out


def qwen3a_rows(mel: int) -> int:
    """The mel rows left after qwen3a's three convolutions (kernel 3, stride 2, padding 1)."""
    for _ in range(3):
        mel = (mel - 1) // 2 + 1
    return mel


def _check_qwen3a(c: _Check, mel: int, e: int, ff: int, blocks: int, want: int) -> int:
    """Qwen3-ASR's encoder (models/qwen3a.cpp; clip.cpp load_tensors 2892): three 3 x 3 convolutions
    (ggml_conv_2d asserts each kernel's input channels, the first's 1), a.conv_out from the rows
    left times the channels into the encoder's width, 13 position rows or more, build_vit's blocks
    (their biases optional), then mm.a.mlp.1 -> GELU -> mm.a.mlp.2 (all four required). Returns the
    output width as the file has it."""
    first = c.by_name.get("a.conv2d.1.weight")
    channels = first.shape[3] if first is not None and len(first.shape) == 4 else 0
    if not channels:
        c.tensor("a.conv2d.1.weight", (3, 3, 1, 1), CONV)  # fails: missing, or not 4-D
    for i, c_in in ((1, 1), (2, channels), (3, channels)):
        c.tensor(f"a.conv2d.{i}.weight", (3, 3, c_in, channels), CONV)
        bias = c.by_name.get(f"a.conv2d.{i}.bias")  # reshaped to [1, 1, C, 1]: [C] does as well
        c.tensor(
            f"a.conv2d.{i}.bias", (channels,) if bias and len(bias.shape) == 1 else (1, 1, channels), VECTOR
        )
    c.tensor("a.conv_out.weight", (qwen3a_rows(mel) * channels, e), MATRIX)
    c.absent("a.conv_out.bias", "which clip.cpp never loads for qwen3a")
    _positions(c, e, QWEN3A_CHUNK_TOKENS)
    for i in range(blocks):
        blk = f"a.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            c.tensor(f"{blk}.{part}.weight", (e, e), MATRIX)
            if f"{blk}.{part}.bias" in c.by_name:
                c.tensor(f"{blk}.{part}.bias", (e,), VECTOR)
        for norm in ("ln1", "ln2"):
            c.tensor(f"{blk}.{norm}.weight", (e,), VECTOR)
            c.tensor(f"{blk}.{norm}.bias", (e,), VECTOR)
        c.tensor(f"{blk}.ffn_up.weight", (e, ff), MATRIX)
        c.tensor(f"{blk}.ffn_down.weight", (ff, e), MATRIX)
        for part, width in (("ffn_up", ff), ("ffn_down", e)):
            if f"{blk}.{part}.bias" in c.by_name:
                c.tensor(f"{blk}.{part}.bias", (width,), VECTOR)
    c.absent(f"a.blk.{blocks}.attn_q.weight", f"past its clip.audio.block_count {blocks}")
    for norm in ("a.pre_ln", "a.post_ln"):
        if f"{norm}.weight" in c.by_name:
            c.tensor(f"{norm}.weight", (e,), VECTOR)
            c.tensor(f"{norm}.bias", (e,), VECTOR)
    up = c.by_name.get("mm.a.mlp.1.weight")
    hidden = up.shape[1] if up is not None and len(up.shape) == 2 and up.shape[0] == e else want
    c.tensor("mm.a.mlp.1.weight", (e, hidden), MATRIX)
    c.tensor("mm.a.mlp.1.bias", (hidden,), VECTOR)
    down = c.by_name.get("mm.a.mlp.2.weight")
    out = down.shape[1] if down is not None and len(down.shape) == 2 and down.shape[0] == hidden else want
    c.tensor("mm.a.mlp.2.weight", (hidden, out), MATRIX)
    c.tensor("mm.a.mlp.2.bias", (out,), VECTOR)
    return out
