"""GET /metrics: Prometheus' text format, read with prometheus_client's own parser.

In process (the real app over the stand-in backend, and runner.serve.metrics alone): what the HTTP
layer counts, each label as documented, the per-answer arithmetic, docs/serve.md's table against every
metric, nothing imported until a server counts. Against real servers of the test model, through the
real clients: after a known sequence of requests every counter moved by exactly what the answers
reported; the gauges against /v1/models; the API key; --queue's refusals; loads and unloads;
--no-metrics."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from runner.engine.answer import Result, SpecStats, Timings
from runner.serve.app import create_app
from runner.serve.metrics import Metrics, ModelState
from tests.serving import COUNTING, HI, MODEL, Server, StandIn, chat, model_server, openai_client, serving

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "serve.md").read_text()
KEY = "sesame"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- reading /metrics ----------------------------------------------------------------------------------


def parsed(text: str) -> Samples:
    """Every sample: (name, its labels sorted) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def by(
    samples: Samples, name: str, *keys: str, but: Callable[[dict[str, str]], bool] = lambda _: False
) -> Counter:
    """`name`'s samples as a Counter keyed by the values of `keys`, those `but` says to leave out left out."""
    found: Counter = Counter()
    for (n, ls), v in samples.items():
        labels = dict(ls)
        if n == name and not but(labels):
            found[tuple(labels[k] for k in keys)] += v
    return found


def runners_own(labels: dict[str, str]) -> bool:
    """The server's own paths (/health, the scrapes themselves): no API's request."""
    return labels.get("api") == "runner"


def scrape(url: str, key: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answer = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")
    return parsed(answer.text)


def settled(
    url: str, check: Callable[[Samples], bool], key: str | None = None, within_s: float = 15
) -> Samples:
    """A scrape once `check` holds: a stream's request is counted as its response ends, a moment after
    its client read the last chunk."""
    deadline = time.monotonic() + within_s
    while True:
        samples = scrape(url, key)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def documented() -> dict[str, tuple[str, set[str]]]:
    """docs/serve.md's table: metric -> (type, labels)."""
    rows = re.findall(r"^\| `(runner_\w+)` \| (\w+) \|([^|]*)\|", PAGE, re.MULTILINE)
    assert len(rows) > 20
    return {name: (kind, set(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def exported(text: str) -> dict[str, tuple[str, set[str]]]:
    """What /metrics exports: metric (a counter's with _total, as the table names it) -> (type, labels)."""
    found = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        found[name] = (family.type, labels)
    return found


# -- in process: the HTTP layer, the arithmetic, the table ------------------------------------------------


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.mark.fast
def test_the_http_layer_counts_each_request_by_api_endpoint_and_status(metrics: Metrics) -> None:
    with TestClient(create_app(StandIn(), metrics=metrics, log=lambda line: None)) as http:
        assert http.post("/v1/chat/completions", content=chat()).status_code == 200
        assert http.post("/v1/chat/completions", content=chat(temperature="hot")).status_code == 400
        assert http.get("/v1/models/smollm2").status_code == 200
        assert http.get("/v1/models/nope").status_code == 404
        assert (
            http.post("/api/chat", json={"model": MODEL, "messages": HI, "stream": False}).status_code == 200
        )
        assert http.delete("/v1/chat/completions").status_code == 405
        assert http.get("/no/such/path").status_code == 404
        assert http.get("/health").status_code == 200
        text = http.get("/metrics").text
    samples = parsed(text)
    assert by(samples, "runner_requests_total", "api", "endpoint", "status") == {
        ("openai", "/v1/chat/completions", "200"): 1,
        ("openai", "/v1/chat/completions", "400"): 1,
        ("openai", "/v1/models/{id:path}", "200"): 1,  # the route's template: one label whatever the id
        ("openai", "/v1/models/{id:path}", "404"): 1,
        ("ollama", "/api/chat", "200"): 1,
        ("openai", "/v1/chat/completions", "405"): 1,
        ("openai", "other", "404"): 1,  # no route: never a label per path a scanner tries
        ("runner", "/health", "200"): 1,
    }  # the scrape itself is counted once its response is out: the next scrape shows it
    durations = by(samples, "runner_request_duration_seconds_count", "api", "endpoint")
    assert durations[("openai", "/v1/chat/completions")] == 3 and sum(durations.values()) == 8
    assert total(samples, "runner_request_duration_seconds_sum") > 0


@pytest.mark.fast
def test_the_api_key_guards_metrics_and_no_metrics_is_a_404(metrics: Metrics) -> None:
    with TestClient(create_app(StandIn(), api_key=KEY, metrics=metrics, log=lambda line: None)) as http:
        refused = http.get("/metrics")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert http.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert http.get("/metrics", headers={"x-api-key": KEY}).status_code == 200
        samples = parsed(http.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).text)
    assert by(samples, "runner_requests_total", "api", "endpoint", "status") == {
        ("runner", "/metrics", "401"): 2,
        ("runner", "/metrics", "200"): 1,
    }
    with TestClient(create_app(StandIn(), log=lambda line: None)) as http:
        gone = http.get("/metrics")
    assert gone.status_code == 404 and "no such endpoint" in gone.json()["error"]["message"]


@pytest.mark.fast
def test_openmetrics_when_the_scraper_asks_for_it(metrics: Metrics) -> None:
    with TestClient(create_app(StandIn(), metrics=metrics, log=lambda line: None)) as http:
        answer = http.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert answer.headers["content-type"].startswith("application/openmetrics-text")
    assert answer.text.endswith("# EOF\n")


def timings(
    prompt: int, cached: int, completion: int, ttft: float, total_s: float, drafted: int = 0
) -> Timings:
    spec = SpecStats(drafted=drafted, accepted=drafted // 2) if drafted else SpecStats()
    return Timings(
        prompt_tokens=prompt,
        prefill_tokens=prompt - cached,
        completion_tokens=completion,
        ttft_s=ttft,
        total_s=total_s,
        speculation=spec,
    )


@pytest.mark.fast
def test_an_answer_counts_its_tokens_its_timings_and_its_drafts(metrics: Metrics) -> None:
    metrics.answered(MODEL, Result("a", "length", timings(30, 10, 5, 0.5, 1.5, drafted=8)))
    metrics.answered(MODEL, Result("b", "stop", timings(20, 0, 1, 0.25, 0.25)))
    metrics.answered(MODEL, Result("", "error", timings(7, 0, 0, 0.0, 0.0), error="no room"))
    samples = parsed(metrics.exposition(None)[0].decode())
    assert total(samples, "runner_prompt_tokens_total", model=MODEL) == 57
    assert total(samples, "runner_cached_tokens_total", model=MODEL) == 10
    assert total(samples, "runner_completion_tokens_total", model=MODEL) == 6
    assert by(samples, "runner_answers_total", "finish") == {("length",): 1, ("stop",): 1, ("error",): 1}
    # time to first token: the two answers that made one; per output token: the one of 2 tokens or more
    assert total(samples, "runner_time_to_first_token_seconds_count") == 2
    assert total(samples, "runner_time_to_first_token_seconds_sum") == pytest.approx(0.75)
    assert total(samples, "runner_time_per_output_token_seconds_count") == 1
    assert total(samples, "runner_time_per_output_token_seconds_sum") == pytest.approx((1.5 - 0.5) / 4)
    assert total(samples, "runner_time_per_output_token_seconds_bucket", le="0.2") == 0
    assert total(samples, "runner_time_per_output_token_seconds_bucket", le="0.3") == 1
    assert (
        total(samples, "runner_draft_tokens_total") == 8
        and total(samples, "runner_draft_accepted_tokens_total") == 4
    )


@pytest.mark.fast
def test_the_state_is_read_at_each_scrape(metrics: Metrics) -> None:
    reads: list[int] = []

    def models() -> list[ModelState]:
        reads.append(1)
        return [ModelState(MODEL, {"cpu": 900, "gpu": 100}, 1, 3, 2, 50, 4096, 4, 4000, 6, 2)]

    metrics.watch(models)
    assert reads == []  # nothing read until asked
    samples = parsed(metrics.exposition(None)[0].decode())
    assert reads == [1]
    assert total(samples, "runner_models_loaded") == 1
    assert by(samples, "runner_model_memory_bytes", "device") == {("cpu",): 900, ("gpu",): 100}
    assert by(samples, "runner_sequences", "state") == {("busy",): 1, ("free",): 3}
    assert total(samples, "runner_requests_waiting", model=MODEL) == 2
    assert total(samples, "runner_kv_cells_used") == 50 and total(samples, "runner_kv_cells_capacity") == 4096
    assert (
        total(samples, "runner_prompt_states") == 4 and total(samples, "runner_prompt_states_bytes") == 4000
    )
    assert total(samples, "runner_prompt_states_kept_total") == 6
    assert total(samples, "runner_prompt_state_hits_total") == 2


@pytest.mark.fast
def test_the_docs_table_is_every_metric_with_its_type_and_labels(metrics: Metrics) -> None:
    """Every metric given an event, so each shows its labels: the table says exactly these."""
    metrics.watch(lambda: [ModelState(MODEL, {"cpu": 1}, 0, 1, 0, 0, 512)])
    metrics.request("openai", "/v1/models", 200, 0.1)
    metrics.answered(MODEL, Result("a", "stop", timings(3, 1, 2, 0.1, 0.2, drafted=2)))
    metrics.embedding(MODEL, 3)
    metrics.embedding(MODEL, 5, rerank=True)
    metrics.refused(MODEL)
    metrics.loaded(MODEL)
    metrics.unloaded(MODEL)
    assert exported(metrics.exposition(None)[0].decode()) == documented()


def test_nothing_imports_prometheus_client_until_a_server_counts() -> None:
    code = (
        "import sys, runner.cli, runner.serve.app, runner.serve.pool, runner.commands.serve\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
        "from runner.serve.metrics import Metrics; Metrics()\n"
        "assert 'prometheus_client' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- a real server of the test model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with model_server(tmp_path_factory.mktemp("serve"), "--parallel", "2", "--ctx", "1024") as running:
        yield running


def extra(answer: Any, name: str) -> Any:
    """A field runner adds beside a client's model (`timings`), as the client kept it."""
    return (answer.model_extra or {})[name]


@pytest.mark.timeout(300)
def test_counters_move_by_exactly_what_was_sent(server: Server) -> None:
    """OpenAI whole, streamed and a completion, Anthropic, a 400 and a 404: every counter moved by the
    usage and timings the answers reported; then an Ollama chat, whose API reports no cached tokens."""
    client = openai_client(server)
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    before = scrape(server.url)
    question = [{"role": "user", "content": "Count from 1 to 30, separated by commas."}]
    whole = client.chat.completions.create(model=MODEL, messages=question, max_tokens=40, temperature=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HI,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    completion = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=30, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=HI, temperature=5)
    message = claude.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert httpx.post(f"{server.url}/v1/nope", json={}).status_code == 404

    streamed_usage = chunks[-1].usage
    streamed_timings = next(extra(c, "timings") for c in chunks if c.choices and c.choices[0].finish_reason)
    usages = [whole.usage, streamed_usage, completion.usage]
    reported = [
        extra(whole, "timings"),
        streamed_timings,
        extra(completion, "timings"),
        extra(message, "timings"),
    ]
    prompt = (
        sum(u.prompt_tokens for u in usages)
        + message.usage.input_tokens
        + message.usage.cache_read_input_tokens
    )
    cached = (
        sum(u.prompt_tokens_details.cached_tokens for u in usages) + message.usage.cache_read_input_tokens
    )
    made = sum(u.completion_tokens for u in usages) + message.usage.output_tokens
    requests = {
        ("openai", "/v1/chat/completions", "200"): 2,
        ("openai", "/v1/chat/completions", "400"): 1,
        ("openai", "/v1/completions", "200"): 1,
        ("anthropic", "/v1/messages", "200"): 1,
        ("openai", "other", "404"): 1,
    }

    def requests_moved(samples: Samples) -> Counter:
        counted = by(samples, "runner_requests_total", "api", "endpoint", "status", but=runners_own)
        counted.subtract(by(before, "runner_requests_total", "api", "endpoint", "status", but=runners_own))
        return +counted

    after = settled(server.url, lambda s: requests_moved(s) == requests)
    assert requests_moved(after) == requests
    durations = by(after, "runner_request_duration_seconds_count", "endpoint", but=runners_own)
    durations.subtract(by(before, "runner_request_duration_seconds_count", "endpoint", but=runners_own))
    assert +durations == {
        ("/v1/chat/completions",): 3,
        ("/v1/completions",): 1,
        ("/v1/messages",): 1,
        ("other",): 1,
    }

    assert moved(before, after, "runner_prompt_tokens_total", model=MODEL) == prompt
    assert cached > 0  # the template's head, shared by every chat request, copied rather than evaluated
    assert moved(before, after, "runner_cached_tokens_total", model=MODEL) == cached
    assert moved(before, after, "runner_completion_tokens_total", model=MODEL) == made
    streamed_finish = next(
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    )
    claude_finish = {"end_turn": "stop", "max_tokens": "length"}[str(message.stop_reason)]
    ended = [
        whole.choices[0].finish_reason,
        streamed_finish,
        completion.choices[0].finish_reason,
        claude_finish,
    ]
    finishes = Counter((reason,) for reason in ended)
    answers = by(after, "runner_answers_total", "finish")
    answers.subtract(by(before, "runner_answers_total", "finish"))
    assert +answers == finishes  # the 400 and the 404 made no answer
    drafted = sum(t["drafted"] for t in reported)
    assert drafted > 0  # the counting prompt drafts (n-gram speculation, the server's default)
    assert moved(before, after, "runner_draft_tokens_total", model=MODEL) == drafted
    assert moved(before, after, "runner_draft_accepted_tokens_total", model=MODEL) == sum(
        t["accepted"] for t in reported
    )
    assert moved(before, after, "runner_time_to_first_token_seconds_count") == 4
    ttft = sum(t["ttft_s"] for t in reported)  # each rounded to 0.1 ms
    assert moved(before, after, "runner_time_to_first_token_seconds_sum") == pytest.approx(ttft, abs=4e-4)
    several = sum(1 for t in reported if t["completion_tokens"] > 1)
    assert moved(before, after, "runner_time_per_output_token_seconds_count") == several

    olla = ollama.Client(host=server.url, timeout=120)
    said = olla.chat(model=MODEL, messages=HI, options={"temperature": 0, "num_predict": 8})
    then = settled(server.url, lambda s: moved(after, s, "runner_requests_total", endpoint="/api/chat") == 1)
    assert by(
        then, "runner_requests_total", "api", "status", but=lambda ls: ls["endpoint"] != "/api/chat"
    ) == {("ollama", "200"): 1}
    assert moved(after, then, "runner_prompt_tokens_total") == said.prompt_eval_count
    assert moved(after, then, "runner_completion_tokens_total") == said.eval_count
    assert 0 <= moved(after, then, "runner_cached_tokens_total") < said.prompt_eval_count
    assert moved(after, then, "runner_answers_total") == 1


def test_embedded_tokens_are_the_usage_reported(server: Server) -> None:
    before = scrape(server.url)
    reply = openai_client(server).embeddings.create(model=MODEL, input=["A cat sat.", "Markets fell today."])
    said = ollama.Client(host=server.url).embed(model=MODEL, input="A kitten sits on a rug.")
    after = settled(
        server.url, lambda s: moved(before, s, "runner_requests_total", endpoint="/api/embed") == 1
    )
    tokens = reply.usage.prompt_tokens + (said.prompt_eval_count or 0)
    assert tokens > 0 and moved(before, after, "runner_embedding_tokens_total", model=MODEL) == tokens
    assert moved(before, after, "runner_prompt_tokens_total") == 0  # no answer: embeddings apart
    assert moved(before, after, "runner_requests_total", endpoint="/v1/embeddings", status="200") == 1


def test_the_gauges_say_what_v1_models_says(server: Server) -> None:
    openai_client(server).completions.create(model=MODEL, prompt=COUNTING, max_tokens=4)
    meta = httpx.get(f"{server.url}/v1/models/{MODEL}").json()["meta"]
    samples = scrape(server.url)
    assert total(samples, "runner_models_loaded") == 1
    assert total(samples, "runner_model_memory_bytes", model=MODEL) == meta["memory"] > 0
    assert by(samples, "runner_sequences", "state") == {("busy",): 0, ("free",): meta["parallel"]}
    assert total(samples, "runner_requests_waiting", model=MODEL) == 0
    capacity = total(samples, "runner_kv_cells_capacity", model=MODEL)
    assert capacity == meta["context"] * meta["parallel"]
    assert 0 < total(samples, "runner_kv_cells_used", model=MODEL) <= capacity
    states = meta["prompt_states"]
    assert total(samples, "runner_prompt_states_kept_total", model=MODEL) == states["kept"]
    assert total(samples, "runner_prompt_state_hits_total", model=MODEL) == states["restored"]
    assert total(samples, "runner_prompt_states_bytes", model=MODEL) == states["bytes"]
    assert total(samples, "runner_model_loads_total", model=MODEL) == 1  # loaded at the start
    assert total(samples, "runner_model_unloads_total") == 0
    exports = exported(httpx.get(f"{server.url}/metrics").text)
    table = documented()
    assert {name: kind for name, (kind, _) in exports.items()} == {
        name: kind for name, (kind, _) in table.items()
    }
    for name, (_, labels) in exports.items():
        assert not labels or labels == table[name][1], name  # labels as documented, where it has samples


@pytest.fixture
def models_dir(smollm2_path: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "other.gguf").symlink_to(smollm2_path)
    return folder


@pytest.mark.timeout(300)
def test_key_queue_loads_and_unloads(models_dir: Path, tmp_path: Path) -> None:
    """Behind a key; one sequence and no queue: a second request while one streams is refused (429) and
    counted; the model's load on demand, its sequence busy, the client that left, Ollama's unload."""
    args = ["--models", str(models_dir), "--parallel", "1", "--queue", "0", "--ctx", "512", "--threads", "1"]
    with serving([*args, "--api-key", KEY], tmp_path / "stderr") as server:
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        assert httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
        first = scrape(server.url, KEY)
        assert total(first, "runner_models_loaded") == 0 and total(first, "runner_model_loads_total") == 0
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)
        stream = client.completions.create(model="other", prompt=COUNTING, max_tokens=400, stream=True)
        next(iter(stream))  # its first token: the one sequence is busy
        busy = scrape(server.url, KEY)
        assert total(busy, "runner_model_loads_total", model="other") == 1
        assert total(busy, "runner_models_loaded") == 1
        assert by(busy, "runner_sequences", "state") == {("busy",): 1, ("free",): 0}
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="other", prompt="Hi", max_tokens=2)
        stream.close()  # the client leaves: 499, its answer interrupted
        left = settled(server.url, lambda s: total(s, "runner_answers_total") == 1, KEY)
        assert total(left, "runner_requests_rejected_total", model="other") == 1
        assert by(left, "runner_answers_total", "finish") == {("interrupted",): 1}
        left = settled(server.url, lambda s: total(s, "runner_requests_total", status="499") == 1, KEY)
        assert by(left, "runner_requests_total", "status", but=runners_own) == {("429",): 1, ("499",): 1}
        auth = {"Authorization": f"Bearer {KEY}"}
        unload = httpx.post(
            f"{server.url}/api/generate", json={"model": "other", "keep_alive": 0}, headers=auth
        )
        assert unload.json()["done_reason"] == "unload"
        gone = settled(server.url, lambda s: total(s, "runner_models_loaded") == 0, KEY)
        assert total(gone, "runner_models_loaded") == 0
        assert total(gone, "runner_model_unloads_total", model="other") == 1
        assert total(gone, "runner_sequences") == 0  # no model loaded: no sequence to say


def test_no_metrics_is_a_404(tmp_path: Path) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    with serving(["--models", str(empty), "--no-metrics", "--threads", "1"], tmp_path / "stderr") as server:
        answer = httpx.get(f"{server.url}/metrics")
        assert answer.status_code == 404 and "no such endpoint" in answer.json()["error"]["message"]
        assert httpx.get(f"{server.url}/v1/models").status_code == 200


@pytest.mark.fast
def test_a_loaded_models_counters_are_exported_at_0_before_their_first_event(metrics: Metrics) -> None:
    """Prometheus' convention: a counter with no sample until its first event leaves rate() and alerts
    without data. Each counter and histogram labelled by the model alone has a sample from its load."""
    metrics.loaded(MODEL)
    samples = parsed(metrics.exposition(None)[0].decode())
    at_zero = [
        "runner_prompt_tokens_total",
        "runner_cached_tokens_total",
        "runner_completion_tokens_total",
        "runner_draft_tokens_total",
        "runner_draft_accepted_tokens_total",
        "runner_embedding_tokens_total",
        "runner_rerank_tokens_total",
        "runner_requests_rejected_total",
        "runner_model_unloads_total",
        "runner_time_to_first_token_seconds_count",
        "runner_time_per_output_token_seconds_count",
    ]
    assert {name: samples.get((name, (("model", MODEL),))) for name in at_zero} == dict.fromkeys(at_zero, 0.0)
    assert samples[("runner_model_loads_total", (("model", MODEL),))] == 1
