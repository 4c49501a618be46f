"""Fuzz campaign for runner.gguf.read_header: mutate a valid header, count what happens.

Every case must end in a GGUFHeader or a GGUFError, the same one whether the header is
read in 1 MiB blocks or in tiny ones; anything else is a crash (exit 1). Cases are
reproducible: case i of --seed S always gets the same input.

    .venv/bin/python scripts/fuzz_gguf.py --cases 10000 --seed 1
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
import traceback
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import runner.gguf.reader  # noqa: E402
from runner.gguf import BytesSource, GGUFError, read_header  # noqa: E402

HUGE = [1 << 31, (1 << 32) - 1, 1 << 40, 1 << 62, (1 << 63) - 1, (1 << 64) - 1]
TYPE_IDS = [-1, 4, 9, 12, 13, 42, 43, 1 << 31]  # value and ggml type ids at and past the edges
READ_BLOCKS = [1, 13, 256, 1 << 20]  # small blocks put fields across block boundaries


def sample() -> bytes:
    """A valid GGUF with every value type, a small vocabulary and mixed tensor types."""
    q = GGMLQuantizationType
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sample.gguf"
        w = GGUFWriter(path, "llama")
        w.add_block_count(2)
        w.add_context_length(2048)
        w.add_float32("llama.rope.freq_base", 10000.0)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_uint64("t.u64", 1 << 40)
        w.add_int8("t.i8", -3)
        w.add_float64("t.f64", 0.125)
        w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")
        w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(40)])
        w.add_array("tokenizer.ggml.scores", [float(-i) for i in range(40)])
        w.add_array("tokenizer.ggml.token_type", [1] * 40)
        w.add_key_value("t.u16s", [1, 2, 3], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT16)
        w.add_tensor("token_embd.weight", np.zeros((40, 34), dtype=np.uint8), raw_dtype=q.Q8_0)
        w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))
        w.add_tensor("blk.0.ffn_down.weight", np.zeros((2, 144), dtype=np.uint8), raw_dtype=q.Q4_K)
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 64), dtype=np.float16))
        w.add_tensor("output.weight", np.zeros((3, 40), dtype=np.uint8), raw_dtype=q.Q4_1)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


def length_fields(data: bytes) -> list[int]:
    """Offsets where a small u64 (most likely a length or a count) is stored."""
    return [i for i in range(len(data) - 8) if 0 < int.from_bytes(data[i : i + 8], "little") < 1 << 16]


def mutate(data: bytes, rng: random.Random, fields: list[int]) -> tuple[bytes, str]:
    """One to four mutations of data; returns the result and their names."""
    out = bytearray(data)
    names = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("flip", "byte", "huge", "type", "cut", "dup"))
        names.append(kind)
        pos = rng.randrange(len(out)) if out else 0
        if kind == "flip" and out:
            out[pos] ^= 1 << rng.randrange(8)
        elif kind == "byte" and out:
            out[pos] = rng.randrange(256)
        elif kind == "huge":
            at = rng.choice(fields)
            out[at : at + 8] = rng.choice(HUGE).to_bytes(8, "little")
        elif kind == "type":
            out[pos : pos + 4] = (rng.choice(TYPE_IDS) % (1 << 32)).to_bytes(4, "little")
        elif kind == "cut":
            del out[rng.randrange(len(out) + 1) :]
        elif kind == "dup":  # repeat a slice: duplicate keys and tensors, shifted offsets
            end = min(len(out), pos + rng.randint(1, 64))
            out[pos:pos] = out[pos:end]
    return bytes(out), "+".join(names)


def outcome(message: str) -> str:
    """The message's shape: numbers and quoted names elided, so equal failures group."""
    what = message.removeprefix("<case> ")
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'…'", what))[:100]


def parse(source: BytesSource, read_block: int) -> str:
    """read_header's result, as text to compare: the header's repr or the error's message."""
    runner.gguf.reader.READ_BLOCK = read_block
    try:
        return repr(read_header(source))
    except GGUFError as exc:
        return f"GGUFError: {exc}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    base = sample()
    fields = length_fields(base)
    outcomes: Counter[str] = Counter()
    crashes = 0
    slowest = (0.0, -1, "")
    peak = (0, -1, "")
    tracemalloc.start()
    for case in range(args.cases):
        rng = random.Random(f"{args.seed}:{case}")
        data, how = mutate(base, rng, fields)
        source = BytesSource(data, size_known=rng.random() < 0.8, name="<case>")
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        start = time.perf_counter()
        try:
            result = parse(source, READ_BLOCKS[-1])
            elapsed = time.perf_counter() - start
            allocated = tracemalloc.get_traced_memory()[1] - before
            # Differential check: reading in small blocks must give the very same result.
            small = parse(source, rng.choice(READ_BLOCKS[:-1]))
            if small != result:
                raise AssertionError(f"block size changes the result:\n  {result[:300]}\n  {small[:300]}")
        except Exception:
            crashes += 1
            print(f"CRASH in case {case} ({how}), seed {args.seed}:", file=sys.stderr)
            traceback.print_exc()
            continue
        outcomes[
            "ok" if result.startswith("GGUFHeader(") else outcome(result.removeprefix("GGUFError: "))
        ] += 1
        slowest = max(slowest, (elapsed, case, how))
        peak = max(peak, (allocated, case, how))
    tracemalloc.stop()

    print(f"cases run: {args.cases} (seed {args.seed}, sample of {len(base)} bytes)")
    print("outcomes:")
    for what, n in outcomes.most_common():
        print(f"  {n:6d}  {what}")
    print(f"crashes: {crashes}")
    print(f"slowest case: {slowest[0] * 1000:.2f} ms (case {slowest[1]}, {slowest[2]}; tracemalloc on)")
    print(f"peak allocation: {peak[0] / 1024:.1f} KiB (case {peak[1]}, {peak[2]})")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
