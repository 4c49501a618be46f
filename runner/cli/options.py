"""Option types shared by every command (defined once, as huggingface_hub's CLI does)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

SAMPLING = "Sampling (defaults: the GGUF's sampling keys, else the catalog's, else llama.cpp's)"
LIMITS = "Context and limits"
OUTPUT = "Output"
SPEED = "Speed"

ModelArg = Annotated[
    str,
    typer.Argument(
        help="An alias from models.toml (smollm2), a .gguf path, or a Hub repo (user/repo:Q4_K_M).",
        show_default=False,
    ),
]
PromptArg = Annotated[
    Optional[str],
    typer.Argument(help="The prompt. Piped stdin comes first, then this.", show_default=False),
]
System = Annotated[Optional[str], typer.Option("--system", "-s", help="System message.", show_default=False)]
Raw = Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")]
Suffix = Annotated[
    Optional[str],
    typer.Option(
        "--suffix",
        help="Fill in the middle: PROMPT is the code before the cursor, this the code after it "
        "(the model's FIM tokens; docs/editors.md).",
        show_default=False,
    ),
]

Temperature = Annotated[
    Optional[float],
    typer.Option(help="0 = greedy, up to 2 [default: 0.8]", rich_help_panel=SAMPLING, show_default=False),
]
TopK = Annotated[
    Optional[int], typer.Option(help="0 = off [default: 40]", rich_help_panel=SAMPLING, show_default=False)
]
TopP = Annotated[
    Optional[float],
    typer.Option(help="(0, 1], 1 = off [default: 0.95]", rich_help_panel=SAMPLING, show_default=False),
]
MinP = Annotated[
    Optional[float],
    typer.Option(help="[0, 1], 0 = off [default: 0.05]", rich_help_panel=SAMPLING, show_default=False),
]
RepeatPenalty = Annotated[
    Optional[float],
    typer.Option(help="(0, 10], 1 = off [default: 1.0]", rich_help_panel=SAMPLING, show_default=False),
]
PresencePenalty = Annotated[
    Optional[float], typer.Option(help="[-2, 2] [default: 0]", rich_help_panel=SAMPLING, show_default=False)
]
FrequencyPenalty = Annotated[
    Optional[float], typer.Option(help="[-2, 2] [default: 0]", rich_help_panel=SAMPLING, show_default=False)
]
Seed = Annotated[
    Optional[int],
    typer.Option(
        help="Same seed, same command: same text [default: random]",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]

MaxTokens = Annotated[
    Optional[int],
    typer.Option(
        help="Stop after N tokens [default: until the model ends or the context is full]",
        rich_help_panel=LIMITS,
        show_default=False,
    ),
]
Stop = Annotated[
    Optional[list[str]],
    typer.Option(help="Stop before this text (repeatable).", rich_help_panel=LIMITS, show_default=False),
]
Ctx = Annotated[
    Optional[int],
    typer.Option(
        help="Each sequence's context window in tokens, padded to a multiple of 256 [default: the most "
        "that fits, up to the trained context and 8192; 2048 per sequence in a batch]",
        rich_help_panel=LIMITS,
        show_default=False,
    ),
]
Threads = Annotated[
    Optional[int],
    typer.Option(help="CPU threads [default: physical cores]", rich_help_panel=LIMITS, show_default=False),
]
Rpc = Annotated[
    Optional[str],
    typer.Option(
        "--rpc",
        help="Spread the model's layers over these workers (runner worker): HOST:PORT[,HOST:PORT...] "
        "(docs/rpc.md)",
        rich_help_panel=LIMITS,
        show_default=False,
    ),
]
Offline = Annotated[
    bool, typer.Option("--offline", help="Use only models already in the cache (as HF_HUB_OFFLINE=1).")
]

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
ListQuants = Annotated[
    bool, typer.Option("--list", help="List the repo's quants and sizes; download nothing.")
]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
Template = Annotated[bool, typer.Option("--template", help="Print the model's chat template alone.")]
SearchText = Annotated[
    str, typer.Argument(help="Text to find in repo names, e.g. llama-3.2-1b.", show_default=False)
]
SEARCH_LIMIT = 20
Limit = Annotated[int, typer.Option("--limit", "-n", min=1, max=1000, help="Show at most N repos.")]
JsonList = Annotated[
    bool,
    typer.Option("--json", help="Print a JSON list of objects instead of the table.", rich_help_panel=OUTPUT),
]
JsonObject = Annotated[
    bool, typer.Option("--json", help="Print one JSON object instead of text.", rich_help_panel=OUTPUT)
]

GpuLayers = Annotated[
    Optional[int],
    typer.Option(
        help="Layers on the GPU, the output layer counting as one; -1 = all [default: the plan]",
        rich_help_panel=LIMITS,
        show_default=False,
    ),
]
KvType = Annotated[
    Optional[str],
    typer.Option(
        help="KV cache type: f16, q8_0, q4_0 ... [default: f16]", rich_help_panel=LIMITS, show_default=False
    ),
]
Schema = Annotated[
    Optional[str],
    typer.Option(
        "--schema",
        help="Answer with JSON that matches this JSON Schema (inline, or a file)",
        rich_help_panel=OUTPUT,
        show_default=False,
    ),
]
Format = Annotated[
    Optional[str],
    typer.Option(
        "--format", help="json: answer with one JSON object", rich_help_panel=OUTPUT, show_default=False
    ),
]
Grammar = Annotated[
    Optional[Path],
    typer.Option(
        "--grammar",
        help="Constrain the answer with a GBNF grammar file",
        rich_help_panel=OUTPUT,
        show_default=False,
    ),
]
Logprobs = Annotated[
    Optional[int],
    typer.Option(
        help="With --json: each answer token's log-probability, and its N most likely alternatives (0-20)",
        show_default=False,
    ),
]
Quality = Annotated[
    Optional[str],
    typer.Option(
        "--quality",
        metavar="[FILE]",
        help="Score how well the model predicts a text instead: perplexity on FILE (UTF-8) or, without "
        "one, on the public-domain text shipped with runner (docs/quality.md)",
        show_default=False,
    ),
]
Reference = Annotated[
    Optional[str],
    typer.Option(
        metavar="MODEL",
        help="With --quality: also the KL-divergence from this model's predictions (same vocabulary), "
        "run once and kept",
        show_default=False,
    ),
]
QualityCtx = Annotated[
    Optional[int],
    typer.Option("--ctx", help="With --quality: tokens per chunk [default: 512]", show_default=False),
]
Repetitions = Annotated[int, typer.Option("--repetitions", "-r", help="Runs of each test (medians).")]
BATCH = "Many prompts"
EachLine = Annotated[
    bool,
    typer.Option(
        "--each-line",
        help="Each stdin line is a prompt (PROMPT, if given, is a template: {} is the line)",
        rich_help_panel=BATCH,
    ),
]
InputFile = Annotated[
    Optional[Path],
    typer.Option(
        "--input",
        help="A JSONL file of prompts: prompt, and optional system, id, max_tokens, schema, sampling fields "
        "(PROMPT, if given, is a template: {} is each prompt)",
        rich_help_panel=BATCH,
        show_default=False,
    ),
]
RunParallel = Annotated[
    Optional[int],
    typer.Option(
        "--parallel",
        help="Prompts decoded at once [default: what fits, at most 8]",
        rich_help_panel=BATCH,
        show_default=False,
    ),
]
Jsonl = Annotated[
    bool,
    typer.Option("--jsonl", help="One JSON object per prompt, in input order", rich_help_panel=BATCH),
]
FlashAttn = Annotated[
    Optional[str],
    typer.Option(
        "--flash-attn",
        help="Flash attention: auto, on or off [default: auto, but off for a chat on the CPU, "
        "where it slows as the context fills]",
        rich_help_panel=LIMITS,
        show_default=False,
    ),
]
Spec = Annotated[
    Optional[str],
    typer.Option(
        "--spec",
        help="Speculative decoding: ngram (drafts what follows an earlier match of the last tokens, "
        "only while it pays) or none [default: ngram]",
        rich_help_panel=SPEED,
        show_default=False,
    ),
]
Draft = Annotated[
    Optional[str],
    typer.Option(
        "--draft",
        metavar="MODEL",
        help="Speculative decoding with a small draft model of the same vocabulary (as MODEL is given).",
        rich_help_panel=SPEED,
        show_default=False,
    ),
]
NoPromptCache = Annotated[
    bool,
    typer.Option(
        "--no-prompt-cache",
        help="Neither load nor store the evaluated prompt head on disk (runner cache shows it).",
        rich_help_panel=SPEED,
    ),
]
PromptCacheSize = Annotated[
    Optional[str],
    typer.Option(
        "--prompt-cache-size",
        metavar="SIZE",
        help="The prompt cache's limit on disk, e.g. 500M; least recently used heads go first [default: 2G]",
        rich_help_panel=SPEED,
        show_default=False,
    ),
]
ClearCache = Annotated[bool, typer.Option("--clear", help="Remove every entry.")]
Force = Annotated[
    bool,
    typer.Option("--force", help="Load even when the estimate says it will not fit.", rich_help_panel=LIMITS),
]
Parallel = Annotated[
    Optional[int],
    typer.Option(
        help="Sequences decoded at once, as run --parallel: --ctx is each one's (2048 by default) "
        "[default: 1; with --serve, runner serve's: 4, fewer if they do not fit]",
        show_default=False,
    ),
]
FitServe = Annotated[
    bool,
    typer.Option(
        "--serve",
        help="Plan as runner serve plans with the same flags, and count what it counts against its "
        "budget: rows of logits for logprobs, the embedding context.",
    ),
]

Json = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON object instead of streamed text.", rich_help_panel=OUTPUT),
]
Verbose = Annotated[
    bool, typer.Option("--verbose", "-v", help="Timings and settings on stderr.", rich_help_panel=OUTPUT)
]
Debug = Annotated[
    bool, typer.Option("--debug", help="Show llama.cpp's log and tracebacks.", rich_help_panel=OUTPUT)
]

CHAT = "Chat"
OptionalModelArg = Annotated[
    Optional[str],
    typer.Argument(
        help="An alias from models.toml (smollm2), a .gguf path, or a Hub repo (user/repo:Q4_K_M) "
        "[default: the catalog's default, or the resumed conversation's model]",
        show_default=False,
    ),
]
Continue = Annotated[
    bool,
    typer.Option(
        "--continue",
        "-c",
        help="Continue the last chat with this prompt (runner run -c 'and then?'); the turn is saved.",
        rich_help_panel=CHAT,
    ),
]
HideReasoning = Annotated[
    bool,
    typer.Option(
        "--hide-reasoning",
        help="Show a reasoning model's thinking nowhere (it is never in the answer).",
        rich_help_panel=OUTPUT,
    ),
]
NoSave = Annotated[
    bool,
    typer.Option(
        "--no-save", help="Keep nothing of this chat (also RUNNER_NO_SAVE=1).", rich_help_panel=CHAT
    ),
]
Resume = Annotated[
    Optional[str],
    typer.Option(
        "--resume",
        "-r",
        is_flag=False,
        flag_value="last",
        metavar="[ID]",
        help="Continue the last conversation, or conversation ID (runner history lists them).",
        rich_help_panel=CHAT,
        show_default=False,
    ),
]
Load = Annotated[
    Optional[Path],
    typer.Option(
        "--load",
        help="Continue a conversation saved as JSON (/save FILE).",
        rich_help_panel=CHAT,
        show_default=False,
    ),
]
Markdown = Annotated[
    bool,
    typer.Option("--markdown", help="Render answers as Markdown (on a terminal).", rich_help_panel=OUTPUT),
]
ConversationId = Annotated[
    str,
    typer.Argument(
        help="A conversation's number, or a kept response's resp_… id (runner history lists both).",
        show_default=False,
    ),
]
HistoryLimit = Annotated[
    Optional[int], typer.Option("--limit", "-n", min=1, help="Show at most N conversations [default: all].")
]

EMBED = "Embeddings"
TextArg = Annotated[
    Optional[str],
    typer.Argument(help="The text to embed. Piped stdin comes first, then this.", show_default=False),
]
EmbedEachLine = Annotated[
    bool,
    typer.Option("--each-line", help="Each stdin line is a text; embedded in batches", rich_help_panel=EMBED),
]
EmbedJsonl = Annotated[
    bool,
    typer.Option(
        "--jsonl",
        help='One JSON object per text, in input order: {"id", "embedding", "usage"}',
        rich_help_panel=EMBED,
    ),
]
Truncate = Annotated[
    bool,
    typer.Option(
        "--truncate",
        help="Cut a text longer than --ctx to its first --ctx tokens [default: refuse it, exit 2]",
        rich_help_panel=EMBED,
    ),
]
EmbedCtx = Annotated[
    Optional[int],
    typer.Option(
        "--ctx",
        help="The longest text in tokens, and the tokens embedded at once [default: 512, or the "
        "trained context if shorter]",
        rich_help_panel=LIMITS,
        show_default=False,
    ),
]

RERANK = "Reranking"
QueryArg = Annotated[str, typer.Argument(help="What the documents are scored against.", show_default=False)]
DocumentsArg = Annotated[
    Optional[list[str]],
    typer.Argument(help="The documents [default: one per stdin line].", show_default=False),
]
RerankJsonl = Annotated[
    bool,
    typer.Option(
        "--jsonl",
        help='Read stdin as JSON lines, a document each: {"text": ...} or a string',
        rich_help_panel=RERANK,
    ),
]
RerankJson = Annotated[
    bool,
    typer.Option(
        "--json",
        help='One JSON object: {"results": [{"index", "relevance_score", "document"}], "usage"}',
        rich_help_panel=OUTPUT,
    ),
]
Top = Annotated[
    Optional[int],
    typer.Option("--top", "-n", min=1, help="Only the N best [default: all]", rich_help_panel=RERANK),
]
RerankTruncate = Annotated[
    bool,
    typer.Option(
        "--truncate",
        help="Cut a document whose pair with the query is over --ctx to fit [default: refuse it, exit 2]",
        rich_help_panel=RERANK,
    ),
]
RerankCtx = Annotated[
    Optional[int],
    typer.Option(
        "--ctx",
        help="The longest query-and-document pair in tokens, and the tokens scored at once [default: 512, "
        "or the trained context if shorter]",
        rich_help_panel=LIMITS,
        show_default=False,
    ),
]
