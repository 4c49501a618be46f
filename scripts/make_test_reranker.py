"""Write a small random-weight BERT reranker (pooling type rank) that the pinned llama.cpp loads.

The smallest file llama.cpp's `bert` architecture (src/models/bert.cpp) takes as a cross-encoder:
token, token-type and position embeddings with their layer norm, LAYERS encoder blocks of width
WIDTH (Q, K, V and output projections with biases, post-attention and post-FFN layer norms, a GELU
FFN), then the classification head that rank pooling applies to the first token's state (`cls`: a
dense layer and tanh; `cls.output`: one logit, the score). Its vocabulary is a WordPiece one
(tokenizer model "bert") of [PAD] [UNK] [CLS] [SEP] [MASK], the words in WORDS and every ASCII letter
and digit alone and as a continuation piece, so any ASCII text tokenizes; [CLS] is BOS, [SEP] is EOS
and SEP, and BOS and EOS are added, so a pair is `[CLS] query [SEP] document [SEP]` as llama-server
builds it. `--template` also writes a `rerank` chat template (tokenizer.chat_template.rerank), which
llama-server uses in place of that pair.

Weights are random but deterministic (numpy's generator from --seed): the same seed, the same bytes,
so the same scores. Every tensor is F32 (620 KB), and the encoder's weights are small: llama.cpp's
CPU kernels round a pair's score differently by where it sits in a batch (alone, or after other
pairs), by 1.3e-3 in llama-server itself with F16 matrices, 2.4e-4 with F32 ones twice these, 1.9e-5
with these; so runner's scores can be held to llama-server's within 1e-4 however each lays out its
batch. (The token types must be F32 anyway: the graph adds their row to the embeddings as it is.)

    python scripts/make_test_reranker.py OUT.gguf [--seed N] [--template]
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType, TokenType

LAYERS = 2
WIDTH = 64
HEADS = 4
FFN = 256
CONTEXT = 512  # positions: the longest pair
EPS = 1e-12
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)
WORDS_TEXT = """the a an is are was of to in on for and or with by at from it this that what which how who
why where when do does can sky blue green red sea water ocean sun light sunlight scatter scattering
air rain cloud clouds grass tree trees leaf leaves cat cats dog dogs bird fish animal pet pets eat food
bread rice apple fruit cook cooking recipe kitchen paris france capital city country london rome river
mountain mountains snow cold hot warm weather summer winter python code program programs language
computer model models search query document documents answer question rerank score best good bad
music song play game ball football team win history war king queen book read write paper science
physics chemistry math number numbers star stars planet earth moon space time day night"""
WORDS = WORDS_TEXT.split()
TEMPLATE = "[CLS] query: {query} [SEP] document: {document} [SEP]"
# the texts whose scores tests/test_rerank.py holds to llama-server's (scripts/bench_rerank.py)
QUERY = "why is the sky blue?"
DOCUMENTS = [
    "The sky is blue because sunlight scatters in the air.",
    "Cats eat fish.",
    "Paris is the capital of France.",
    "Héllo wörld, ZZZ 42!",
    "Rain falls from the clouds over the sea and the mountains in winter.",
    "a cat is a small pet",
    "the history of music, football and physics: " + "book " * 40,
    "Blue water, green grass; red sun.",
]


def vocabulary() -> list[str]:
    """WordPiece tokens as llama.cpp stores them: a word's first piece after "▁" (its phantom
    space), a continuation piece bare; specials as they are."""
    pieces = list(string.ascii_lowercase + string.digits)
    tokens = SPECIALS + ["▁" + word for word in dict.fromkeys(WORDS)]
    tokens += ["▁" + p for p in pieces if "▁" + p not in tokens] + pieces
    tokens += ["▁" + p for p in string.punctuation]
    return tokens


def write_reranker(path: str | Path, seed: int = 0, template: bool = False) -> Path:
    """The reranker at `path`, its weights drawn from `seed`."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens = vocabulary()
    w = GGUFWriter(str(path), "bert")
    w.add_name("test-reranker")
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(WIDTH)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_layer_norm_eps(EPS)
    w.add_causal_attention(False)
    w.add_pooling_type(PoolingType.RANK)
    w.add_classifier_output_labels(["LABEL_0"])
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL for t in tokens])
    w.add_token_type_count(2)
    w.add_bos_token_id(CLS)
    w.add_eos_token_id(SEP)
    w.add_sep_token_id(SEP)
    w.add_unk_token_id(UNK)
    w.add_pad_token_id(PAD)
    w.add_mask_token_id(MASK)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)
    if template:
        w.add_chat_template([{"name": "rerank", "template": TEMPLATE}])

    def tensor(name: str, *ne: int, scale: float = 0.1, one: bool = False) -> None:
        """A tensor of ggml shape ne (ne[0] a row), F32; a norm's weight near one."""
        data = (rng.standard_normal(tuple(reversed(ne))) * scale).astype(np.float32)
        if one:
            data += 1.0
        w.add_tensor(name, data)

    tensor("token_embd.weight", WIDTH, len(tokens), scale=0.5)
    tensor("token_types.weight", WIDTH, 2, scale=0.1)
    tensor("position_embd.weight", WIDTH, CONTEXT, scale=0.1)
    tensor("token_embd_norm.weight", WIDTH, one=True)
    tensor("token_embd_norm.bias", WIDTH)
    for il in range(LAYERS):
        b = f"blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"{b}.{name}.weight", WIDTH, WIDTH, scale=0.1)
            tensor(f"{b}.{name}.bias", WIDTH)
        tensor(f"{b}.attn_output_norm.weight", WIDTH, one=True)
        tensor(f"{b}.attn_output_norm.bias", WIDTH)
        tensor(f"{b}.ffn_up.weight", WIDTH, FFN, scale=0.075)
        tensor(f"{b}.ffn_up.bias", FFN)
        tensor(f"{b}.ffn_down.weight", FFN, WIDTH, scale=0.04)
        tensor(f"{b}.ffn_down.bias", WIDTH)
        tensor(f"{b}.layer_output_norm.weight", WIDTH, one=True)
        tensor(f"{b}.layer_output_norm.bias", WIDTH)
    tensor("cls.weight", WIDTH, WIDTH, scale=0.3)
    tensor("cls.bias", WIDTH)
    tensor("cls.output.weight", WIDTH, 1, scale=0.5)
    tensor("cls.output.bias", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--template", action="store_true", help="also write a rerank chat template")
    args = parser.parse_args()
    write_reranker(args.out, args.seed, args.template)
    print(f"{args.out.stat().st_size:,} bytes\t{args.out}")


if __name__ == "__main__":
    main()
