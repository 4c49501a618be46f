"""Speculative decoding through `runner serve`: a copy task, `--spec ngram` against `--spec none`.

    python scripts/bench_serve_spec.py [--rounds 3] [--only ngram|none] [--json] [--runner-args '...']

Each client asks the model to repeat a ~300-token English text exactly (8 fixed texts below, 285-305
SmolLM2 tokens each), greedy (temperature 0, seed 1), --max-tokens 320, as a streaming POST
/v1/chat/completions with stream_options.include_usage: the answer is the prompt's text again, the
case n-gram speculation is for. Two servers, interleaved in rounds (ngram, none, ngram, ...): `runner
serve MODEL --spec ngram` and `runner serve MODEL --spec none`, each with --parallel 8, --ctx 2048,
--threads 2, started on a free port, waited on until GET /health is 200, warmed with one short
request, measured, and stopped. When `runner serve --help` lists no --spec, the two servers are
started identically and a note says so loudly: the figures then compare a server with itself.
  1 client      the first 4 texts one after another: decode tok/s per request (completion tokens
                after the first / first content delta to the last), their median; TTFT p50 (send to
                the first non-empty content delta)
  8 clients     the 8 texts at once: aggregate tok/s (all completion tokens / first send to last
                end), TTFT p50
The two loads word the request differently, so the 8 clients' prompts share no long head with the
1-client load's in a server's prompt cache. Per load also: completion tokens per request, how many
answers are the source text exactly, and the drafts the server reports (`drafted`, `accepted` in the
final chunk's non-standard `timings`, or in its `speculation` object; `-` when it reports none).
Medians across rounds, the count of answers where ngram's text differs from none's in the same round
(greedy: it should be 0 for 1 client; 8 clients decoded in one batch may part at near ties whatever the
speculation, as the batch's make-up changes with arrival: two identical servers differed in 6 of 8
once), then two targets: 1 client decode tok/s ngram >= 1.3x none; 8 clients
aggregate tok/s ngram >= 1.0x none. With --json, stdout is one JSON object (settings, medians, every
round) and the table goes to stderr with the progress. The servers' own output goes to log files in a
temporary folder, named when one fails. The model file is `runner show MODEL --offline --json`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
from benchlib import free_port, interleaved, machine, model_file, progress, start, stop, target, wait_ready

MODES = ("ngram", "none")
SINGLE = 4  # texts the 1-client load sends one after another
ASK = {  # per load: a different head, so one load's prompts are not in the prompt cache for the other
    "1": "Repeat the following text exactly:",
    "8": "Repeat the following text exactly, word for word:",
}
TEXTS = [
    "The town of Millbrook sits in a narrow valley between two wooded hills, and for most of its history "
    "it lived from the river that runs through it. In the early years a wooden mill stood at the bend "
    "below the bridge, grinding wheat and barley for the farms around. Later a paper factory replaced "
    "it, and for almost a century the smell of wet pulp hung over the lower streets every morning. The "
    "factory closed when the owners moved their work to the coast, and many families left with it. Those "
    "who stayed turned the old buildings into workshops, a small theatre and a market hall where farmers "
    "sell cheese, honey and apples every Saturday. Today visitors come for the walking paths along the "
    "river, the stone bridge with its five arches, and the bakery on the main square, which has used the "
    "same oven since the year the mill was built. In autumn the hills turn red and gold, and the town "
    "holds a festival with music, lanterns and a race of paper boats down the river. The children build "
    'their boats for weeks before the race, and the winner"s name is painted on a board that hangs in '
    "the market hall beside the names of every winner since the first festival. Some of those names "
    "belong to grandparents who still come to watch, and they stand on the bridge every year to cheer "
    "for their grandchildren, telling anyone who will listen how much faster the river used to be when "
    "they were young. The festival ends after dark, when the lanterns are set floating on the water.",
    "Bees are among the most useful insects on the planet, and they are far more organised than they "
    "look. A single hive may hold tens of thousands of workers, a few hundred males and one queen, whose "
    "only task is to lay eggs. The workers change jobs as they grow older. The youngest clean the cells "
    "and feed the larvae; a little later they build wax combs and guard the entrance; only in the last "
    "weeks of their short lives do they fly out to gather nectar and pollen. A forager that finds a rich "
    "patch of flowers returns to the hive and performs a dance on the comb. The angle of the dance tells "
    "the others the direction of the flowers in relation to the sun, and its length tells them how far "
    "away they are. Nectar is stored in the cells and slowly thickened into honey as the bees fan it "
    "with their wings. In winter the colony forms a tight cluster around the queen and shivers to keep "
    "warm, living on the honey it saved in summer. Without bees, many fruits and vegetables would be "
    "rare and expensive, because so many plants depend on them to carry pollen from one flower to the "
    "next. In recent years many colonies have been lost to disease, poor weather and the loss of wild "
    "meadows, and farmers, scientists and ordinary gardeners are now working together to plant more "
    "flowers and protect the bees that remain. Even a small pot of lavender on a window sill can feed a "
    "few hungry bees on a summer afternoon.",
    "Dear Anna, thank you so much for your letter and for the photographs of the new house. The garden "
    "looks wonderful, and I can see why you fell in love with the place the moment you walked through "
    "the gate. We are all well here. Tom has started his new job at the hospital and comes home tired "
    "but happy, and the twins have both joined the swimming club, which means that I spend every Tuesday "
    "and Thursday evening sitting beside a very warm pool with a book I never manage to read. The "
    "weather has been strange this spring: sunshine in the morning, hail at lunch and a rainbow before "
    "dinner. Grandmother celebrated her ninetieth birthday last month. We had a party in the village "
    "hall with all the cousins, a cake in the shape of her old bicycle and a speech from the mayor, who "
    "was once her pupil at the primary school. She danced twice and told everyone she would be back for "
    "her hundredth. We would love to visit you in the summer, perhaps in the second week of August, if "
    "that suits you. Please write and tell us what you think, and give our love to Peter and the "
    "children. We could bring the old photograph albums that you asked about, and the recipe for the "
    "plum cake. With warm wishes from all of us, and hoping to see you soon, Mary. P.S. The twins say "
    "hello and want to know whether the new house has a tree house.",
    "To make a simple loaf of bread you need only flour, water, salt and yeast, but the way you handle "
    "them makes all the difference. Start by mixing five hundred grams of strong white flour with ten "
    "grams of salt in a large bowl. In a jug, stir seven grams of dried yeast into three hundred and "
    "fifty millilitres of warm water and leave it for a few minutes until it begins to foam. Pour the "
    "liquid into the flour and mix with a wooden spoon until a rough dough forms. Turn it out onto a "
    "lightly floured table and knead it for about ten minutes, pushing it away with the heel of your "
    "hand, folding it back and turning it, until it feels smooth and springs back when you press it. "
    "Place the dough in an oiled bowl, cover it with a damp cloth and leave it somewhere warm for an "
    "hour, or until it has doubled in size. Knock it back, shape it into a round and set it on a baking "
    "tray dusted with flour. Let it rise again for forty minutes while the oven heats to two hundred and "
    "twenty degrees. Slash the top with a sharp knife, bake for thirty minutes, and check that the loaf "
    "sounds hollow when you tap its base. Let it cool on a rack before you cut it. Once you are "
    "comfortable with the basic loaf, try adding seeds, herbs or a handful of grated cheese to the "
    "dough. Each small change teaches you something new about how dough behaves, and soon you will bake "
    "without a recipe.",
    "The first railways were built to carry coal, not people. In the mines of northern England, horses "
    "pulled wagons along wooden rails long before anyone thought of using steam. When engineers finally "
    "put a steam engine on wheels, many people doubted that it would ever be more than a curiosity. The "
    "early locomotives were slow, noisy and unreliable, and they often broke down or set fire to the "
    "fields beside the track. Yet within a few decades railways had spread across the country and then "
    "across the world. They changed the way people lived in ways no one had expected. Fresh milk and "
    "fish could reach city markets in a single day. Newspapers printed in the capital arrived in distant "
    "towns the same morning. Clocks had to be set to a common time so that the timetables made sense, "
    "and the idea of a standard national time was born. Ordinary families took their first holidays at "
    "the seaside, and small fishing villages grew into busy resorts with hotels, piers and promenades. "
    'Some people feared that the speed of the trains would harm passengers" health, but the crowds kept '
    "coming, and the age of travel for everyone had begun. Within a single lifetime, a journey that had "
    "once taken a week by coach could be made between breakfast and lunch, and the map of the country "
    "seemed to shrink. Many of the stations built in those years are still in use today, and some of "
    "them are among the finest buildings in their towns, with iron roofs, clocks and painted tiles.",
    'Our club meets on the first Monday of every month at seven o"clock in the upstairs room of the Red '
    "Lion. New members are always welcome, and you do not need any experience to join. Each meeting "
    "begins with a short talk by one of our members on a subject of their choice. In recent months we "
    "have heard about the history of maps, the life of moths, the art of bookbinding and the best way to "
    "grow tomatoes on a windy balcony. After the talk there is a break for tea and biscuits, and then we "
    "split into small groups to work on our projects for the summer show. This year the theme of the "
    "show is the sea, and members are preparing paintings, photographs, models of ships and a large "
    "quilt made from old sails. The show will open in the library on the first Saturday of July and stay "
    "open for two weeks. The yearly fee is twelve pounds, which covers the room, the tea and the "
    "printing of our newsletter. If you would like to give a talk, please speak to the secretary at the "
    "end of any meeting. We also organise two outings a year, one in spring and one in autumn, to a "
    "museum, a garden or a place of interest within an easy drive of the town. Lunch is usually at a "
    "country pub on the way home. Places on the coach are limited, so please put your name on the list "
    "at the door as early as you can, and tell us about any special needs.",
    "Mountain weather can change very quickly, and many accidents happen to walkers who set out well "
    "prepared for the morning but not for the afternoon. Before any walk on high ground, check the "
    "forecast for the summits as well as for the valley, because the wind at the top can be twice as "
    "strong and the temperature ten degrees lower. Tell someone where you are going and when you expect "
    "to be back. Carry a map and a compass, and know how to use them, since a phone can lose its signal "
    "or run out of battery just when you need it most. Pack a warm layer, a waterproof jacket, a hat and "
    "gloves even in summer, along with more food and water than you think you will need. Start early, so "
    "that you have plenty of daylight in hand if something goes wrong. Watch the sky as you climb: if "
    "the cloud comes down and you can no longer see the path, it is usually wiser to turn back than to "
    "push on. There is no shame in returning without reaching the top. The mountain will still be there "
    "next week, and the best walkers are the ones who come home safely every time and are able to walk "
    "again another day. If you do get into trouble, stay calm, find shelter from the wind, put on every "
    "layer you have and call the rescue services, giving them your position as clearly as you can. Many "
    "rescue teams are volunteers who leave their work and families to help.",
    'The library"s new reading room opened last week after two years of work, and it has already become '
    "one of the busiest places in the city. The architects kept the old brick walls and the tall arched "
    "windows but replaced the dark wooden floor with pale oak and added a glass roof that fills the room "
    "with soft light. Long tables run down the middle, each with lamps and power sockets, and quiet "
    "corners with armchairs line the walls. On the upper gallery there is a collection of local "
    "newspapers going back more than a hundred and fifty years, which anyone may read on request. The "
    'children"s section has moved to a bright room of its own next door, with low shelves, cushions on '
    "the floor and a small stage for story time. A café on the ground floor serves soup, sandwiches and "
    "cakes made by a bakery down the street. The librarians say that visits have doubled since the "
    "opening and that many of the new visitors are students who come to work in the evenings, when the "
    "room stays open until ten. The city council hopes to open two more rooms like it in other parts of "
    "the city within the next five years. The first of them is planned for the old fire station near the "
    "harbour, which has stood empty since the new station opened on the ring road. Work on the building "
    "should begin next spring, and the council has asked local people what they would most like to find "
    "inside it.",
]


@dataclass
class Reply:
    ttft: float  # send to the first non-empty content delta (to the end when there was none)
    end: float  # send to the last byte
    decode: float  # first content delta to the last one
    tokens: int  # completion tokens, from the usage chunk (content deltas when it is missing)
    prompt_tokens: int
    text: str
    usage: bool  # whether the server sent a usage chunk
    drafted: int | None  # from the final chunk's timings, when the server reports them
    accepted: int | None

    @property
    def decode_tok_s(self) -> float | None:
        return (self.tokens - 1) / self.decode if self.tokens > 1 and self.decode > 0 else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def drafts(timings: dict[str, Any]) -> tuple[int | None, int | None]:
    """`drafted` and `accepted` from an answer's timings: at its top or in a `speculation` object
    (as `runner run --json` names them); None where the server reports neither."""
    for where in (timings, timings.get("speculation")):
        if isinstance(where, dict) and "drafted" in where:
            return int(where["drafted"]), int(where.get("accepted", 0))
    return None, None


def has_spec_flag() -> bool:
    """Whether `runner serve --help` lists --spec (the flag is newer than `runner run`'s)."""
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "runner", "serve", "--help"], capture_output=True, text=True, env=env
    )
    return re.search(r"--spec(?![\w-])", out.stdout + out.stderr) is not None


def server_command(mode: str, args: argparse.Namespace, port: int) -> list[str]:
    command = [sys.executable, "-m", "runner", "serve", args.model, "--port", str(port)]
    command += ["--parallel", "8", "--ctx", str(args.ctx), "--threads", str(args.threads)]
    if args.spec_flag:
        command += ["--spec", mode]
    return command + shlex.split(args.runner_args)


def messages(load: str, i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{ASK[load]}\n\n{TEXTS[i]}"}]


async def chat(client: httpx.AsyncClient, model: str, msgs: list[dict[str, str]], max_tokens: int) -> Reply:
    body = {
        "model": model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0, "seed": 1,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    sent = time.perf_counter()
    first = last = None
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise RuntimeError(f"error in the stream: {chunk['error']}")
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    last = time.perf_counter()
                    first = first or last
                    parts.append(content)
    end = time.perf_counter() - sent
    tokens = usage["completion_tokens"] if usage else len(parts)
    prompt = usage.get("prompt_tokens", 0) if usage else 0
    ttft = end if first is None else first - sent
    decode = 0.0 if first is None or last is None else last - first
    return Reply(ttft, end, decode, tokens, prompt, "".join(parts), usage is not None, *drafts(timings))


def summary(replies: list[Reply], wall: float) -> dict[str, Any]:
    rates = [r.decode_tok_s for r in replies if r.decode_tok_s is not None]
    tokens = sum(r.tokens for r in replies)
    drafted = [r.drafted for r in replies if r.drafted is not None]
    accepted = [r.accepted for r in replies if r.accepted is not None]
    return {
        "decode_tok_s_p50": statistics.median(rates) if rates else None,
        "aggregate_tok_s": tokens / wall,
        "ttft_p50_s": percentile([r.ttft for r in replies], 0.5),
        "tokens_per_request": tokens / len(replies),
        "prompt_tokens_per_request": sum(r.prompt_tokens for r in replies) / len(replies),
        "copied_exactly": sum(r.text.strip() == TEXTS[i].strip() for i, r in enumerate(replies)),
        "drafted": sum(drafted) if drafted else None,
        "accepted": sum(accepted) if accepted else None,
        "wall_s": wall,
        "no_usage": sum(not r.usage for r in replies),
        "texts": [r.text for r in replies],
        "replies": [{k: v for k, v in asdict(r).items() if k != "text"} for r in replies],
    }


async def measure(mode: str, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    port = free_port()
    process = start(server_command(mode, args, port), log)
    limits = httpx.Limits(max_connections=len(TEXTS) + 4, max_keepalive_connections=0)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
            ready = await wait_ready(client, process, args.ready_timeout)
            progress(f"  {mode}: ready in {ready:.1f} s on port {port}")
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            await chat(client, model, [{"role": "user", "content": "Say hello."}], 8)  # warm-up
            result: dict[str, Any] = {"ready_s": ready}
            began = time.perf_counter()
            replies = [await chat(client, model, messages("1", i), args.max_tokens) for i in range(SINGLE)]
            result["1"] = one = summary(replies, time.perf_counter() - began)
            progress(
                f"  {mode}: 1 client decode {fmt(one['decode_tok_s_p50'], 1)} tok/s (median of {SINGLE}), "
                f"TTFT p50 {one['ttft_p50_s']:.3f} s, {one['tokens_per_request']:.0f} tokens/request"
            )
            began = time.perf_counter()
            replies = list(
                await asyncio.gather(
                    *(chat(client, model, messages("8", i), args.max_tokens) for i in range(len(TEXTS)))
                )
            )
            result["8"] = eight = summary(replies, time.perf_counter() - began)
            progress(
                f"  {mode}: 8 clients {eight['aggregate_tok_s']:.1f} tok/s aggregate, "
                f"TTFT p50 {eight['ttft_p50_s']:.3f} s, {eight['tokens_per_request']:.0f} tokens/request"
            )
            if one["no_usage"] or eight["no_usage"]:
                progress(f"  warning: {mode} sent no usage chunk; content deltas counted as tokens")
            return result
    finally:
        stop(process)


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


DECODE_1 = "1 client decode tok/s (median per request)"
ROWS = {  # table row: (load, figure)
    DECODE_1: ("1", "decode_tok_s_p50"),
    "1 client TTFT p50 s": ("1", "ttft_p50_s"),
    "1 client tokens/request": ("1", "tokens_per_request"),
    "1 client prompt tokens/request": ("1", "prompt_tokens_per_request"),
    "8 clients aggregate tok/s": ("8", "aggregate_tok_s"),
    "8 clients decode tok/s (median per request)": ("8", "decode_tok_s_p50"),
    "8 clients TTFT p50 s": ("8", "ttft_p50_s"),
    "8 clients tokens/request": ("8", "tokens_per_request"),
    "8 clients prompt tokens/request": ("8", "prompt_tokens_per_request"),
}


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def differing(rounds: Rounds, load: str) -> tuple[int, int] | None:
    """How many of a load's answers differ between ngram and none in the same round, and of how many."""
    if len(rounds) < 2:
        return None
    pairs = [
        (a, b)
        for ngram, none in zip(rounds["ngram"], rounds["none"], strict=True)
        for a, b in zip(ngram[load]["texts"], none[load]["texts"], strict=True)
    ]
    return sum(a != b for a, b in pairs), len(pairs)


def drafts_cell(results: list[dict], load: str) -> str:
    drafted = [r[load]["drafted"] for r in results if r[load]["drafted"] is not None]
    accepted = [r[load]["accepted"] for r in results if r[load]["accepted"] is not None]
    if not drafted:
        return "-"
    return f"{sum(accepted)}/{sum(drafted)} ({sum(accepted) / max(1, sum(drafted)):.0%})"


Rounds = dict[str, list[dict]]


def report(args: argparse.Namespace, setup: dict[str, str], rounds: Rounds, out: TextIO) -> dict:
    """The table and the targets, on `out`; returns the medians."""
    medians = {
        mode: {row: median([r[load][key] for r in rounds[mode]]) for row, (load, key) in ROWS.items()}
        for mode in args.only
    }
    for key, value in setup.items():
        print(f"{key}: {value}", file=out)
    if not args.spec_flag:
        print(NO_FLAG, file=out)
    print(f"{args.rounds} rounds, medians", file=out)
    both = len(args.only) == 2
    print(f"| figure | {' | '.join(args.only)} |" + (" ngram / none |" if both else ""), file=out)
    print("|---|" + "---|" * (len(args.only) + both), file=out)

    def versus(row: str) -> float | None:
        ngram, none = medians.get("ngram", {}).get(row), medians.get("none", {}).get(row)
        return ngram / none if ngram is not None and none else None

    for row in ROWS:
        cells = " | ".join(fmt(medians[m][row]) for m in args.only)
        print(f"| {row} | {cells} |" + (f" {fmt(versus(row))} |" if both else ""), file=out)
    for load, name in (("1", "1 client"), ("8", "8 clients")):
        total = SINGLE if load == "1" else len(TEXTS)
        cells = " | ".join(
            f"{sum(r[load]['copied_exactly'] for r in rounds[m])}/{total * len(rounds[m])}" for m in args.only
        )
        print(f"| {name} answers = the source text | {cells} |" + (" |" if both else ""), file=out)
        cells = " | ".join(drafts_cell(rounds[m], load) for m in args.only)
        print(f"| {name} drafts accepted/drafted | {cells} |" + (" |" if both else ""), file=out)
    for load, name in (("1", "1 client"), ("8", "8 clients")):
        diff = differing(rounds, load)
        if diff is not None:
            print(f"{name}: {diff[0]} of {diff[1]} answers differ between ngram and none", file=out)
    # without --spec on serve the ratios compare a server with itself: no target is met or missed
    ratio = versus if args.spec_flag else lambda row: None
    print("targets:" + ("" if args.spec_flag else " (n/a: serve has no --spec)"), file=out)
    for line in (
        target("1 client decode tok/s, ngram / none", ratio(DECODE_1), 1.3, True),
        target("8 clients aggregate tok/s, ngram / none", ratio("8 clients aggregate tok/s"), 1.0, True),
    ):
        print(f"  {line}", file=out)
    return medians


NO_FLAG = (
    "NOTE: `runner serve --help` lists no --spec: both servers were started identically (whatever "
    "speculation serve does by default), so ngram and none below are the same server measured twice"
)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--model", default="smollm2", help="runner's model (alias or path)")
    parser.add_argument("--only", choices=MODES, help="measure one server alone")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--ctx", type=int, default=2048, help="context per slot")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runner-args", default="", help="more flags for runner serve: '--flash-attn off'")
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for /health")
    parser.add_argument("--json", action="store_true", help="print medians and every round as JSON")
    args = parser.parse_args()
    args.only = [args.only] if args.only else list(MODES)
    path = model_file(args.model)
    args.spec_flag = has_spec_flag()
    if not args.spec_flag:
        progress(f"\n!!! {NO_FLAG} !!!\n")
    found = {"python": sys.version.split()[0]}
    for dist in ("runner", "llama_cpp_python", "httpx"):
        found[dist] = importlib.metadata.version(dist)
    setup = {"machine": machine(), "versions": ", ".join(f"{k} {v}" for k, v in found.items())}
    setup["model"] = str(path)
    setup["settings"] = (
        f"8 slots x {args.ctx} context each, {args.threads} threads, {args.max_tokens} tokens at most, "
        f"greedy, 1 client: {SINGLE} texts in turn, 8 clients: 8 texts at once"
        + (f", runner {args.runner_args}" if args.runner_args else "")
        + ("" if args.spec_flag else ", serve has no --spec")
    )
    rounds = interleaved(
        list(args.only), args.rounds, "bench_serve_spec-", lambda mode, log: measure(mode, args, log)
    )
    # with --json, stdout is the JSON alone and the table goes to stderr
    medians = report(args, setup, rounds, sys.stderr if args.json else sys.stdout)
    if args.json:
        flag = {"serve_has_spec": args.spec_flag}
        print(json.dumps({**setup, **flag, "medians": medians, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
