"""Reranking: scripts/make_test_reranker.py's model scored in-process and by `runner rerank`, against
llama-server --reranking's own scores with its defaults for the same file and texts (recorded below),
and every bad input refused with one line and exit 2, as is the reranker asked to generate."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.commands.rerank import ranked
from runner.engine.embed import IsAReranker
from runner.engine.engine import Engine
from runner.engine.llamacpp import Placement
from runner.engine.rerank import MAX_DOCUMENTS, NotAReranker, PairTooLong, QueryTooLong, Reranker
from runner.memory.arch import cannot_generate
from tests.conftest import run_cli
from tests.helpers import load_script

# The bound, for the same batch: runner and llama-server agree to 0 alone, 1.2e-5 all 8 in one.
# Not across batches: a pair's score moves with what shares its batch (llama.cpp's CPU flash-attention
# kernel, on by llama-server's default as by runner's), by up to 1.5e-3 here (docs/rerank.md)
TOLERANCE = 1e-4
make = load_script("make_test_reranker")
QUERY, DOCUMENTS = make.QUERY, make.DOCUMENTS
# llama-server --reranking with its defaults (flash attention "auto": on, on the CPU), the pinned build,
# 2 threads, seed 0: each document in a request of its own, then all 8 in one request
SERVER_SCORES = [
    -0.8089609146118164, -0.4437981843948364, -0.22084565460681915, -0.13841767609119415,
    -0.45903974771499634, -0.25645947456359863, -2.134817600250244, -0.16306377947330475,
]  # fmt: skip
SERVER_SCORES_BATCHED = [
    -0.8093493580818176, -0.44366455078125, -0.2223292738199234, -0.13845612108707428,
    -0.45874595642089844, -0.25629138946533203, -2.133941411972046, -0.16178108751773834,
]  # fmt: skip
SERVER_SCORES_FA_OFF = [  # llama-server --reranking -fa off, each document alone
    -0.8096712231636047, -0.44366347789764404, -0.22190798819065094, -0.13852150738239288,
    -0.4586058259010315, -0.25641709566116333, -2.134000301361084, -0.16201002895832062,
]  # fmt: skip
SERVER_SCORES_TEMPLATE_BATCHED = [  # with a `rerank` template, all 8 in one request
    -0.6593949794769287, -0.03871507570147514, 0.24974225461483002, 0.3535158038139343,
    -0.32492929697036743, 0.06795041263103485, -1.8970332145690918, 0.6770508885383606,
]  # fmt: skip
CLS, SEP = 2, 3


@pytest.fixture(scope="module")
def reranker(reranker_path: Path) -> Iterator[Reranker]:
    with Engine(reranker_path, n_ctx=512, n_threads=2) as engine:
        engine.context.close()
        with Reranker(engine) as r:
            yield r


@pytest.mark.fast
def test_the_written_model_is_the_same_bytes_for_the_same_seed(reranker_path: Path, tmp_path: Path) -> None:
    make = load_script("make_test_reranker")
    again = make.write_reranker(tmp_path / "again.gguf")
    assert again.read_bytes() == reranker_path.read_bytes()
    assert make.write_reranker(tmp_path / "other.gguf", seed=1).read_bytes() != reranker_path.read_bytes()


@pytest.mark.model
def test_a_pair_is_built_as_llama_server_builds_it(reranker: Reranker) -> None:
    query = reranker.engine.model.tokenize("sky", add_special=False)
    document = reranker.engine.model.tokenize("blue sea", add_special=False)
    assert reranker.pair("sky", "blue sea") == [CLS, *query, SEP, *document, SEP]
    assert (reranker.n_ctx, reranker.n_cls_out, reranker.pooling, reranker.template) == (512, 1, "rank", None)


@pytest.mark.model
def test_scores_are_llama_servers_alone_and_batched(reranker: Reranker) -> None:
    assert reranker.context.flash_attn is None  # llama-server's default, "auto"
    alone = [reranker.scores(QUERY, [d])[0] for d in DOCUMENTS]
    batched = reranker.scores(QUERY, DOCUMENTS)
    assert max(abs(a - b) for a, b in zip(alone, SERVER_SCORES, strict=True)) <= TOLERANCE
    assert max(abs(a - b) for a, b in zip(batched, SERVER_SCORES_BATCHED, strict=True)) <= TOLERANCE
    assert max(SERVER_SCORES) - min(SERVER_SCORES) > 1.0  # the documents' scores differ: the check can fail


@pytest.mark.model
def test_flash_attention_asked_off_is_llama_servers_fa_off(reranker_path: Path) -> None:
    """`runner serve --flash-attn off` reaches the rerank context: the scores are llama-server -fa off's."""
    with Engine(reranker_path, n_ctx=512, n_threads=2, placement=Placement(flash_attn=False)) as engine:
        engine.context.close()
        with Reranker(engine) as r:
            alone = [r.scores(QUERY, [d])[0] for d in DOCUMENTS]
    assert max(abs(a - b) for a, b in zip(alone, SERVER_SCORES_FA_OFF, strict=True)) <= TOLERANCE
    assert max(abs(a - b) for a, b in zip(SERVER_SCORES_FA_OFF, SERVER_SCORES, strict=True)) > 5 * TOLERANCE


@pytest.mark.model
def test_a_rerank_template_is_used_as_llama_server_uses_it(tmp_path: Path) -> None:
    path = load_script("make_test_reranker").write_reranker(tmp_path / "t.gguf", template=True)
    with Engine(path, n_ctx=512, n_threads=2) as engine:
        engine.context.close()
        with Reranker(engine) as r:
            assert r.template is not None and "{document}" in r.template
            scores = r.scores(QUERY, DOCUMENTS)
    assert max(abs(a - b) for a, b in zip(scores, SERVER_SCORES_TEMPLATE_BATCHED, strict=True)) <= TOLERANCE


@pytest.mark.model
def test_a_pair_too_long_is_refused_before_decoding_or_cut_when_asked(reranker: Reranker) -> None:
    long = "cat " * 600
    with pytest.raises(PairTooLong) as refused:
        reranker.pairs(QUERY, ["sky", long])
    assert (refused.value.index, refused.value.limit) == (1, 512) and refused.value.n_tokens > 600
    said = f"document 1: the query and this document make {refused.value.n_tokens:,} tokens together"
    assert str(refused.value).startswith(said)
    cut = reranker.pairs(QUERY, [long], truncate=True)[0]
    whole = reranker.pair(QUERY, long)
    assert len(cut) == 512 and cut[:-1] == whole[:511] and cut[-1] == SEP
    assert reranker.scores(QUERY, ["sky", long], truncate=True)[0] == pytest.approx(
        reranker.scores(QUERY, ["sky"])[0], abs=TOLERANCE
    )
    with pytest.raises(QueryTooLong):
        reranker.pairs("sky " * 600, ["a"], truncate=True)


@pytest.mark.model
def test_a_chat_model_is_not_a_reranker_and_a_reranker_does_not_embed(
    engine: Engine, reranker: Reranker
) -> None:
    with pytest.raises(NotAReranker, match=r"smollm2-test is not a reranking model \(its pooling is 'none'"):
        Reranker(engine, name="smollm2-test")
    from runner.engine.embed import Embedder

    with pytest.raises(IsAReranker):
        Embedder(reranker.engine)


@pytest.mark.fast
def test_ranked_is_best_first_ties_in_order_and_top() -> None:
    assert ranked([0.1, 0.5, -1.0, 0.5], None) == [1, 3, 0, 2]
    assert ranked([0.1, 0.5, -1.0, 0.5], 2) == [1, 3]
    assert ranked([0.1], 5) == [0]


# --- runner rerank ------------------------------------------------------------------------------------


def test_rerank_prints_score_tab_document_best_first(reranker_path: Path) -> None:
    done = run_cli("rerank", str(reranker_path), QUERY, *DOCUMENTS)  # one batch, as llama-server's request
    assert done.returncode == 0 and done.stderr == b""
    lines = [line.split("\t", 1) for line in done.stdout.decode().splitlines()]
    expected = sorted(range(len(DOCUMENTS)), key=lambda i: -SERVER_SCORES_BATCHED[i])
    assert [doc for _, doc in lines] == [DOCUMENTS[i] for i in expected]
    assert all(
        abs(float(score) - SERVER_SCORES_BATCHED[i]) <= TOLERANCE
        for (score, _), i in zip(lines, expected, strict=True)
    )


def test_rerank_reads_stdin_lines_or_jsonl_and_writes_json(reranker_path: Path) -> None:
    lines = "\n".join(DOCUMENTS[:3]).replace("\n", "\n\n") + "\n"  # blank lines are skipped
    plain = run_cli("rerank", str(reranker_path), QUERY, "--json", "--top", "2", input=lines.encode())
    assert plain.returncode == 0, plain.stderr.decode()
    body = json.loads(plain.stdout)
    assert [r["index"] for r in body["results"]] == sorted(range(3), key=lambda i: -SERVER_SCORES[i])[:2]
    assert [r["document"]["text"] for r in body["results"]] == [
        DOCUMENTS[r["index"]] for r in body["results"]
    ]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    rows = "\n".join(json.dumps({"text": d} if i % 2 else d) for i, d in enumerate(DOCUMENTS[:3]))
    jsonl = run_cli("rerank", str(reranker_path), QUERY, "--jsonl", "--json", input=rows.encode())
    assert jsonl.returncode == 0, jsonl.stderr.decode()
    assert [r["relevance_score"] for r in json.loads(jsonl.stdout)["results"]] == [
        r["relevance_score"]
        for r in json.loads(run_cli("rerank", str(reranker_path), QUERY, *DOCUMENTS[:3], "--json").stdout)[
            "results"
        ]
    ]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        ((QUERY,), b"", "no documents to rerank"),
        (
            (QUERY,),
            b"sky\n" * (MAX_DOCUMENTS + 1),
            f"{MAX_DOCUMENTS + 1:,} documents: a rerank takes at most {MAX_DOCUMENTS:,}",
        ),
        ((QUERY, "sky", "cat " * 600), b"", "document 2: the query and this document make 60"),
        ((QUERY,), b"sky\n" + b"cat " * 600, "line 2: the query and this document make 60"),
        (
            (QUERY, "--jsonl"),
            b'{"text": 3}\n',
            'line 1: a document is a JSON string or an object with a string "text"',
        ),
        ((QUERY, "--jsonl"), b"[not json\n", "line 1 is not JSON"),
        ((QUERY,), b"sky\n\xff\n", "line 2 is not UTF-8 text"),
        (("  ", "sky"), b"", "the query is empty"),
        ((QUERY, "sky", " "), b"", "document 2: the document is empty"),
        ((QUERY, "sky", "--jsonl"), b"", "--jsonl reads documents from stdin"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    reranker_path: Path, args: tuple[str, ...], stdin: bytes, message: str
) -> None:
    done = run_cli("rerank", str(reranker_path), *args, input=stdin)
    err = done.stderr.decode()
    assert (done.returncode, done.stdout) == (2, b""), err
    assert err.startswith("runner: error: ") and message in err and err.count("\n") == 1, err


def test_truncate_cuts_the_document_and_scores_it(reranker_path: Path) -> None:
    done = run_cli("rerank", str(reranker_path), QUERY, "sky", "cat " * 600, "--truncate")
    assert done.returncode == 0, done.stderr.decode()
    assert len(done.stdout.decode().splitlines()) == 2


def test_a_chat_model_is_refused_naming_it_and_a_reranker_does_not_embed(reranker_path: Path) -> None:
    done = run_cli("rerank", "smollm2", QUERY, "sky")
    assert (done.returncode, done.stdout) == (2, b"")
    assert "smollm2 is not a reranking model (its pooling is 'none'" in done.stderr.decode()
    embed = run_cli("embed", str(reranker_path), "sky")
    assert embed.returncode == 2 and "this model is a reranker" in embed.stderr.decode()


def test_fit_plans_the_reranker(reranker_path: Path) -> None:
    done = run_cli("fit", str(reranker_path), "--json")
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["needs_bytes"] > 0
    # llama.cpp makes no KV cache for BERT (create_memory): its load logs weights, output and compute
    # buffers only, and so does the plan (as a llama of its shape, 262,144 bytes of KV cache)
    assert json.loads(done.stdout)["estimate"]["kv_bytes"] == 0
    table = run_cli("fit", str(reranker_path)).stdout.decode()
    assert "KV cache type    none: llama.cpp keeps no KV cache for bert" in table, table


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (("run", "{model}", "Hi"), b""),
        (("run", "{model}", "Hi", "--raw"), b""),
        (("chat", "{model}"), b"Hi\n"),
        (("bench", "{model}"), b""),
    ],
)
def test_a_reranker_asked_to_generate_is_one_line_and_exit_2(
    reranker_path: Path, args: tuple[str, ...], stdin: bytes
) -> None:
    done = run_cli(*(a.format(model=reranker_path) for a in args), input=stdin)
    err = done.stderr.decode()
    assert (done.returncode, done.stdout) == (2, b""), err
    assert err == (
        f"runner: error: {reranker_path} is a reranking model: it scores documents against a query "
        "(runner rerank, POST /v1/rerank) and does not generate text\n"
    )


@pytest.mark.fast
@pytest.mark.parametrize(
    ("arch", "pooling", "says"),
    [
        (
            "bert",
            4,
            "is a reranking model: it scores documents against a query (runner rerank, POST /v1/rerank)",
        ),
        ("qwen3", 4, "is a reranking model"),  # a causal reranker (Qwen3-Reranker) is one too
        ("bert", 1, "is an encoder (bert) that keeps no KV cache and does not generate text: it embeds"),
        ("nomic-bert", None, "is an encoder (nomic-bert)"),
        ("llada", None, "is a llada model, which llama.cpp keeps no KV cache for"),
        ("llama", None, None),
        ("qwen3", 1, None),  # an embedding model that generates too
        (None, None, None),
    ],
)
def test_cannot_generate_says_why(arch: str | None, pooling: int | None, says: str | None) -> None:
    why = cannot_generate(arch, pooling)
    if says is None:
        assert why is None
    else:
        assert why is not None and why.startswith(says), why


def test_the_pages_examples_run(reranker_path: Path, tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "rerank.md").read_text()
    lines = [ln for ln in page.split("```sh\n", 1)[1].split("```", 1)[0].splitlines() if ln.strip()]
    assert len(lines) == 4
    for line in lines:
        command = line.replace("reranker.gguf", str(reranker_path)).replace(
            "runner ", f"{sys.executable} -m runner "
        )
        done = subprocess.run(["bash", "-c", command], capture_output=True, cwd=tmp_path, timeout=120)
        assert done.returncode == 0 and done.stderr == b"", (line, done.stderr.decode())
        assert done.stdout.strip(), line
