"""`GET /metrics`: what the server did and holds, in Prometheus' text format, from one registry per
server (docs/serve.md#metrics names every metric and label).

Counted where the events happen, once per request or event, never per token:
  - the HTTP layer (runner.serve.app's AccessLog, as it writes the access line): each request by API,
    endpoint and status, and how long it took;
  - each model's thread (runner.serve.engine_backend, as an answer's Result comes out of the loop): its
    prompt, cached and completion tokens, its time to first token and per output token, its drafted
    and accepted tokens, how it ended; an embedding's or a rerank's tokens; a request refused by --queue;
  - the pool (runner.serve.pool): a model loaded, a model unloaded.
What is a state rather than an event (the models loaded and their planned memory, each model's
sequences busy and free, requests waiting, KV cells, kept prompt states) is read when /metrics is
asked, by a collector over the pool: nothing is kept up to date for nobody.

prometheus_client (its registry, its exposition, its collectors) is imported when a server builds its
Metrics, and only then: never by `runner --help`, `runner run`, or `runner serve --no-metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.engine.answer import Result

if TYPE_CHECKING:
    from starlette.routing import BaseRoute
    from starlette.types import Scope

# seconds: from a cached prompt's first token on a GPU to a long prompt queued on a CPU
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
REQUEST_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
OTHER = "other"  # the endpoint label of a path no route claims (a scanner's guesses: never one label each)


@dataclass(frozen=True)
class ModelState:
    """One loaded model as /metrics reads it, at the moment it is asked (runner.serve.pool)."""

    name: str
    memory: dict[str, int]  # planned bytes per device ("cpu", "gpu")
    busy: int  # sequences holding an answer
    free: int
    waiting: int  # requests in flight without a sequence yet: the queue --queue bounds
    kv_used: int  # KV cells holding a token, every sequence (a free one keeps its last prompt)
    kv_cells: int  # the context's cells, every sequence
    states: int = 0  # prompt states kept in RAM past their sequence (--cache-ram)
    states_bytes: int = 0
    states_kept: int = 0  # kept since the model loaded
    states_hits: int = 0  # brought back into a sequence since the model loaded


class Metrics:
    """The server's registry: its counters and histograms, bumped by the layers that see each event,
    and a collector that reads the pool's state when /metrics is asked (`watch`). Thread-safe: the
    model threads count answers while the event loop counts requests."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

        disable_created_metrics()  # no `_created` series beside each counter: this process is the server
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self._models: Callable[[], Sequence[ModelState]] = lambda: ()

        def counter(name: str, doc: str, labels: Sequence[str]) -> Any:
            return Counter(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Any:
            return Histogram(name, doc, labels, registry=registry, buckets=buckets)

        http, model = ("api", "endpoint", "status"), ("model",)
        self.requests = counter(
            "runner_requests", "HTTP requests answered, by API, endpoint and status", http
        )
        self.request_seconds = histogram(
            "runner_request_duration_seconds",
            "From a request's arrival to the last byte of its response (a stream's whole length)",
            ("api", "endpoint"),
            REQUEST_BUCKETS,
        )
        self.answers = counter(
            "runner_answers", "Answers ended, by how (the engine's finish reason)", (*model, "finish")
        )
        self.prompt_tokens = counter("runner_prompt_tokens", "Prompt tokens of every answer", model)
        self.cached_tokens = counter(
            "runner_cached_tokens", "Prompt tokens reused from the KV cache, not evaluated", model
        )
        self.completion_tokens = counter("runner_completion_tokens", "Tokens generated", model)
        self.ttft = histogram(
            "runner_time_to_first_token_seconds",
            "From a request's arrival (its wait for a sequence included) to its first token",
            model,
            TTFT_BUCKETS,
        )
        self.tpot = histogram(
            "runner_time_per_output_token_seconds",
            "An answer's decode time over its tokens after the first (answers of two tokens or more)",
            model,
            TPOT_BUCKETS,
        )
        self.drafted = counter(
            "runner_draft_tokens", "Tokens drafted by speculative decoding and verified", model
        )
        self.accepted = counter(
            "runner_draft_accepted_tokens", "Drafted tokens the model's own sampling kept", model
        )
        self.embedded = counter("runner_embedding_tokens", "Tokens of the texts embedded", model)
        self.reranked = counter(
            "runner_rerank_tokens", "Tokens of the (query, document) pairs reranked", model
        )
        self.rejected = counter(
            "runner_requests_rejected",
            "Requests refused with a 429 because --queue requests already wait",
            model,
        )
        self.loads = counter("runner_model_loads", "Models loaded (at the start, or on demand)", model)
        self.unloads = counter(
            "runner_model_unloads", "Models unloaded (idle past keep-alive, for room, asked)", model
        )
        self._per_model = (  # labelled by model alone: at 0 from a model's load (`loaded`)
            self.prompt_tokens,
            self.cached_tokens,
            self.completion_tokens,
            self.ttft,
            self.tpot,
            self.drafted,
            self.accepted,
            self.embedded,
            self.reranked,
            self.rejected,
            self.unloads,
        )
        registry.register(_Collector(self))

    # -- the events ------------------------------------------------------------------------------

    def request(self, api: str, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(api, endpoint, str(status)).inc()
        self.request_seconds.labels(api, endpoint).observe(seconds)

    def answered(self, model: str, result: Result) -> None:
        """An answer's end, in the model's thread: its tokens, its timings, its drafts."""
        t = result.timings
        self.answers.labels(model, result.finish_reason if result.error is None else "error").inc()
        self.prompt_tokens.labels(model).inc(t.prompt_tokens)
        self.cached_tokens.labels(model).inc(t.cached_tokens)
        self.completion_tokens.labels(model).inc(t.completion_tokens)
        if t.completion_tokens > 0:
            self.ttft.labels(model).observe(t.ttft_s)
        if t.completion_tokens > 1:
            self.tpot.labels(model).observe(max(0.0, t.total_s - t.ttft_s) / (t.completion_tokens - 1))
        if t.speculation.drafted:
            self.drafted.labels(model).inc(t.speculation.drafted)
            self.accepted.labels(model).inc(t.speculation.accepted)

    def embedding(self, model: str, tokens: int, *, rerank: bool = False) -> None:
        """An embedding request's texts pooled, or a rerank request's pairs scored."""
        (self.reranked if rerank else self.embedded).labels(model).inc(tokens)

    def refused(self, model: str) -> None:
        """A request refused because --queue requests already wait (429)."""
        self.rejected.labels(model).inc()

    def loaded(self, model: str) -> None:
        """A model loaded: counted, and each of its counters and histograms exported from now on at 0
        (Prometheus' convention: a series with no sample until its first event leaves rate() and an
        alert on it without data). Answers by finish reason appear as each reason first happens."""
        self.loads.labels(model).inc()
        for metric in self._per_model:
            metric.labels(model)

    def unloaded(self, model: str) -> None:
        self.unloads.labels(model).inc()

    def watch(self, models: Callable[[], Sequence[ModelState]]) -> None:
        """Where the collector reads the loaded models from, at each scrape (the pool's `states`)."""
        self._models = models

    # -- the HTTP side ---------------------------------------------------------------------------

    def counter_for(self, routes: Sequence[BaseRoute], api_of: Callable[[str], str]) -> RequestCounter:
        return RequestCounter(self, routes, api_of)

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The registry in the format the scraper asks for (Prometheus' text, or OpenMetrics), with
        its content type."""
        from prometheus_client.exposition import choose_encoder

        encode, content_type = choose_encoder(accept or "")
        return encode(self.registry), content_type


class RequestCounter:
    """What AccessLog calls as each request ends: its API, its endpoint as the route's path template
    (`/v1/models/{id:path}`, never the path asked: one label per route, whatever is asked), its status."""

    def __init__(self, metrics: Metrics, routes: Sequence[BaseRoute], api_of: Callable[[str], str]) -> None:
        self.metrics = metrics
        self.routes = routes
        self.api_of = api_of

    def __call__(self, scope: Scope, status: int, seconds: float) -> None:
        path = scope.get("path", "")
        endpoint = endpoint_of(self.routes, scope)
        self.metrics.request(self.api_of(path), endpoint, status, seconds)


def endpoint_of(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The path template of the route that takes (or would take, with another method) the request."""
    from starlette.routing import Match

    asked = {
        "type": "http",
        "path": scope.get("path", ""),
        "method": scope.get("method", "GET"),
        "root_path": "",
    }
    for route in routes:
        match, _ = route.matches(asked)
        if match != Match.NONE:
            return str(getattr(route, "path", OTHER))
    return OTHER


class _Collector:
    """The gauges (and the counters the pool's models keep themselves), read at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return list(self._families([]))  # the names, for the registry's clash check: no model read

    def collect(self) -> Iterator[Any]:
        return self._families(self.metrics._models())

    @staticmethod
    def _families(models: Sequence[ModelState]) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def gauge(name: str, doc: str, labels: Sequence[str] = ("model",)) -> Any:
            return GaugeMetricFamily(name, doc, labels=labels)

        loaded = GaugeMetricFamily("runner_models_loaded", "Models loaded now", value=len(models))
        memory = gauge(
            "runner_model_memory_bytes", "A loaded model's planned memory, per device", ("model", "device")
        )
        sequences = gauge("runner_sequences", "A loaded model's sequences, busy or free", ("model", "state"))
        waiting = gauge(
            "runner_requests_waiting", "Requests waiting for a free sequence (bounded by --queue)"
        )
        kv_used = gauge("runner_kv_cells_used", "KV cells holding a token, every sequence of a model")
        kv_cells = gauge("runner_kv_cells_capacity", "KV cells of a model's context, every sequence")
        states = gauge("runner_prompt_states", "Prompt states kept in RAM past their sequence (--cache-ram)")
        states_bytes = gauge("runner_prompt_states_bytes", "Bytes of the prompt states kept in RAM")
        kept = CounterMetricFamily(
            "runner_prompt_states_kept", "Prompt states kept since the model loaded", labels=("model",)
        )
        hits = CounterMetricFamily(
            "runner_prompt_state_hits",
            "Kept prompt states brought back into a sequence since the model loaded",
            labels=("model",),
        )
        for m in models:
            for device, n in sorted(m.memory.items()):
                memory.add_metric([m.name, device], n)
            sequences.add_metric([m.name, "busy"], m.busy)
            sequences.add_metric([m.name, "free"], m.free)
            waiting.add_metric([m.name], m.waiting)
            kv_used.add_metric([m.name], m.kv_used)
            kv_cells.add_metric([m.name], m.kv_cells)
            states.add_metric([m.name], m.states)
            states_bytes.add_metric([m.name], m.states_bytes)
            kept.add_metric([m.name], m.states_kept)
            hits.add_metric([m.name], m.states_hits)
        yield from (loaded, memory, sequences, waiting, kv_used, kv_cells, states, states_bytes, kept, hits)
