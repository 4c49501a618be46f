"""A vision model from the Hub: `runner pull` fetches the repository's projector with the model (the
one that goes with its quant, verified as every download), and later commands find the pair in the
cache: `run --image` without --mmproj, `list`, `show`, `serve` on demand; `--mmproj REF` takes a Hub
reference. A loopback Hub (tests/fakehub) serves the SmolLM2 test model and two test projectors of it
(scripts/make_test_projector.py) through the real huggingface_hub client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.errors import DownloadError, IntegrityError
from runner.hub import fetch
from runner.hub.catalog import load_catalog
from runner.hub.projectors import cached_projector, choose_projector, pull_projector
from runner.hub.quants import RepoFile
from runner.hub.refs import resolve
from tests.conftest import CLOSED_ENDPOINT, run_cli
from tests.fakehub import FakeHub, fake_hub_fixture, hf_env, hub_cache_dir, instant_backoff
from tests.helpers import random_png as png
from tests.serving import model_server, openai_client

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_test_projector.py"
REPO = "user/vis-GGUF"
MODEL_FILE = "vis-Q4_K_M.gguf"  # SmolLM2's bytes under a Q4_K_M name: the repo offers no Q4_K_M projector
F16, Q8 = "mmproj-vis-F16.gguf", "mmproj-vis-Q8_0.gguf"
REFERENCE = f"{REPO}:Q4_K_M"
QUESTION = "What is this?"

fake_hub = fake_hub_fixture(scope="module")


# -- which projector goes with a model: hand-picked listings ---------------------------------------


def names(*paths: str) -> list[RepoFile]:
    return [RepoFile(p) for p in paths]


@pytest.mark.fast
def test_the_projector_of_the_models_quant_else_f16_else_q8_else_the_closest_in_bits() -> None:
    repo = names(
        "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-F16.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-F32.gguf"
    )

    def pick(model: str, files: list[RepoFile] = repo) -> str | None:
        found = choose_projector(files, model)
        return found.path if found else None

    assert pick("m-Q8_0.gguf") == "mmproj-m-Q8_0.gguf"  # its own quant
    assert pick("m-Q4_K_M.gguf") == "mmproj-m-F16.gguf"  # none of its quant: F16 (llama.cpp: Q8_0)
    assert pick("m-F32.gguf") == "mmproj-m-F32.gguf"
    assert pick("m-Q4_K_M.gguf", names("mmproj-m-Q8_0.gguf", "mmproj-m-F32.gguf")) == "mmproj-m-Q8_0.gguf"
    # neither: the closest in bits to the model's, as llama.cpp picks every one
    assert pick("m-Q4_K_M.gguf", names("mmproj-m-BF16.gguf", "mmproj-m-Q6_K.gguf")) == "mmproj-m-Q6_K.gguf"
    assert pick("m-Q4_K_M.gguf", names("m-Q4_K_M.gguf", "README.md")) is None  # a text model
    # the model's folder or one above it, the deepest first; never a folder beside it
    nested = names("Q4/m-Q4_K_M.gguf", "Q4/mmproj-Q8_0.gguf", "mmproj-F16.gguf", "other/mmproj-Q4_K_M.gguf")
    assert pick("Q4/m-Q4_K_M.gguf", nested) == "Q4/mmproj-Q8_0.gguf"
    assert pick("m-Q4_K_M.gguf", nested) == "mmproj-F16.gguf"


@pytest.mark.fast
def test_a_catalog_entry_pins_its_projector() -> None:
    from runner.hub.catalog import CatalogEntry

    entry = CatalogEntry("x", "user/x", quant="Q4_K_M", mmproj="mmproj-x-Q8_0.gguf")
    files = names("x-Q4_K_M.gguf", "mmproj-x-F16.gguf", "mmproj-x-Q8_0.gguf")
    found = choose_projector(files, "x-Q4_K_M.gguf", entry=entry)
    assert found is not None and found.path == "mmproj-x-Q8_0.gguf"
    gemma = load_catalog().get("gemma3:4b")
    assert gemma is not None and gemma.mmproj == "mmproj-model-f16.gguf"


# -- a pull, and the pair found again ----------------------------------------------------------------


def cli(hub: FakeHub, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return run_cli(*args, env={**hf_env(hub.endpoint, hub_cache_dir()), **env})


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vision-pull")
    made = {"a.png": folder / "a.png", F16: folder / "f16.gguf", Q8: folder / "q8.gguf"}
    made["a.png"].write_bytes(png(1))
    for name, seed in ((F16, 1), (Q8, 2)):  # two projectors of the model, their weights unlike
        command = [
            sys.executable,
            str(SCRIPT),
            str(made[name]),
            "--for",
            str(smollm2_path),
            "--seed",
            str(seed),
        ]
        subprocess.run(command, check=True, capture_output=True)
    return made


@pytest.fixture(scope="module")
def pulled(fake_hub: FakeHub, files: dict[str, Path], smollm2_path: Path) -> list[str]:
    """`runner pull REPO`: its stdout lines."""
    fake_hub.add_repo(
        REPO, {MODEL_FILE: smollm2_path, F16: files[F16], Q8: files[Q8], "README.md": b"# vis\n"}
    )
    done = cli(fake_hub, "pull", REPO)
    assert done.returncode == 0, done.stderr
    assert "a vision model, its projector mmproj-vis-F16.gguf beside it" in done.stderr.decode()
    return done.stdout.decode().splitlines()


def run_json(hub: FakeHub, *args: str, **env: str) -> dict:
    done = cli(hub, "run", *args, "--temperature", "0", "--max-tokens", "12", "--json", **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_pull_fetches_the_projector_of_the_models_quant_verified(
    fake_hub: FakeHub, files: dict[str, Path], pulled: list[str]
) -> None:
    model, projector = (Path(line.split("\t")[1]) for line in pulled)
    assert model.name == MODEL_FILE and projector.name == F16  # no Q4_K_M projector: the F16 one
    assert projector.parent == model.parent  # the same snapshot: the pairing later commands find
    assert projector.read_bytes() == files[F16].read_bytes()
    assert not (projector.parent / Q8).exists()  # only the one that goes with the model
    assert cached_projector(model) == projector


def test_list_and_show_say_a_pulled_pair_takes_images(fake_hub: FakeHub, pulled: list[str]) -> None:
    rows = [line.split("\t") for line in cli(fake_hub, "list").stdout.decode().splitlines()]
    (row,) = [r for r in rows if r[0] == REFERENCE]
    assert row[1] == "Q4_K_M" and row[4] == "yes"
    assert all(r[4] == "-" for r in rows if r[0] != REFERENCE)  # the text models (smollm2's mirror)
    (listed,) = [m for m in json.loads(cli(fake_hub, "list", "--json").stdout) if m["reference"] == REFERENCE]
    assert Path(listed["projector"]).name == F16
    shown = cli(fake_hub, "show", REFERENCE, HF_HUB_OFFLINE="1")  # from the cache alone
    assert shown.returncode == 0, shown.stderr
    (line,) = [x for x in shown.stdout.decode().splitlines() if x.startswith("vision")]
    assert "yes (projector mlp, 4 image tokens an image of 28 x 28 px" in line
    as_json = json.loads(cli(fake_hub, "show", REFERENCE, "--json").stdout)
    assert Path(as_json["vision"]["projector"]).name == F16 and as_json["vision"]["image_tokens"] == 4


def test_run_image_after_pull_needs_no_mmproj_and_mmproj_takes_a_hub_reference(
    fake_hub: FakeHub, files: dict[str, Path], pulled: list[str]
) -> None:
    image = str(files["a.png"])
    paired = run_json(fake_hub, REFERENCE, QUESTION, "--image", image, HF_HUB_OFFLINE="1")
    explicit = run_json(fake_hub, REFERENCE, QUESTION, "--image", image, "--mmproj", str(files[F16]))
    assert paired["text"] and paired["text"] == explicit["text"] and paired["usage"] == explicit["usage"]
    # --mmproj REF: the repo's Q8_0 projector, fetched (verified) into the cache, then used
    by_ref = run_json(fake_hub, REFERENCE, QUESTION, "--image", image, "--mmproj", f"{REPO}:{Q8}")
    by_path = run_json(fake_hub, REFERENCE, QUESTION, "--image", image, "--mmproj", str(files[Q8]))
    assert by_ref["text"] == by_path["text"]
    model = Path(pulled[0].split("\t")[1])
    assert (model.parent / Q8).read_bytes() == files[Q8].read_bytes()
    assert cached_projector(model) == model.parent / F16  # still the one that goes with the model
    # and by its quant tag, from the cache now: no Hub needed
    by_tag = run_json(
        fake_hub, REFERENCE, QUESTION, "--image", image, "--mmproj", f"{REPO}:Q8_0", HF_HUB_OFFLINE="1"
    )
    assert by_tag["text"] == by_path["text"]


def test_a_model_without_a_projector_says_so_in_one_line(fake_hub: FakeHub, files: dict[str, Path]) -> None:
    done = cli(fake_hub, "run", "smollm2", QUESTION, "--image", str(files["a.png"]))
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and done.stdout == b""
    assert lines == [
        "runner: error: --image needs the model's vision projector; none was pulled with smollm2: "
        "give --mmproj FILE|REF"
    ]
    missing = cli(
        fake_hub, "run", "smollm2", QUESTION, "--image", str(files["a.png"]), "--mmproj", f"{REPO}:Q2_K"
    )
    assert missing.returncode == 2
    assert (
        "user/vis-GGUF has no projector of quant Q2_K; its projectors: mmproj-vis-F16.gguf"
        in missing.stderr.decode()
    )


def test_a_vision_model_not_cached_and_out_of_reach_says_so_not_mmproj(files: dict[str, Path]) -> None:
    # no Hub (a closed port), or offline: neither the model nor its projector can come, and that is
    # the cause, as the same run without --image says it
    image, model = ("--image", str(files["a.png"])), "user/never-pulled-GGUF"
    closed = {"HF_ENDPOINT": CLOSED_ENDPOINT}
    unreachable = run_cli("run", model, QUESTION, *image, env=closed)
    offline = run_cli("run", model, QUESTION, *image, env={**closed, "HF_HUB_OFFLINE": "1"})
    text_alone = run_cli("run", model, QUESTION, env=closed)
    for done in (unreachable, offline, text_alone):
        assert done.returncode == 1 and done.stdout == b"", done.stderr
        assert len(done.stderr.decode().strip().splitlines()) == 1 and b"--mmproj" not in done.stderr
    said = f"{model} is not in the cache, nor its vision projector, and".encode()
    assert said + b" the Hugging Face Hub cannot be reached (127.0.0.1:9" in unreachable.stderr
    assert said + b" runner is offline" in offline.stderr
    assert b"the Hugging Face Hub cannot be reached (127.0.0.1:9" in text_alone.stderr


def test_serve_takes_images_through_the_pulled_projector_named_or_on_demand(
    fake_hub: FakeHub, files: dict[str, Path], pulled: list[str], tmp_path: Path
) -> None:
    import base64

    expected = run_json(fake_hub, REFERENCE, QUESTION, "--image", str(files["a.png"]), HF_HUB_OFFLINE="1")
    url = "data:image/png;base64," + base64.b64encode(files["a.png"].read_bytes()).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    # named, loaded at the start; then no MODEL (the helper's slot takes a flag): every cached model,
    # each loaded at its first request
    for model in (REFERENCE, "--offline"):
        with model_server(tmp_path, "--offline", model=model) as server:
            client = openai_client(server)
            listed = {m.id: m.model_extra["meta"] for m in client.models.list().data}
            assert listed[REFERENCE]["vision"] is True  # said before it loads
            assert listed[REFERENCE]["loaded"] is (model == REFERENCE)
            assert listed.get("smollm2", {"vision": False})["vision"] is False
            chat = client.chat.completions.create(
                model=REFERENCE, messages=[{"role": "user", "content": parts}], max_tokens=12, temperature=0
            )
            assert chat.choices[0].message.content == expected["text"]


# -- a projector whose bytes are wrong is never trusted ---------------------------------------------


@pytest.fixture
def instant_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from runner import retry

    monkeypatch.setattr(retry, "sleep", lambda _: None)
    with instant_backoff():
        yield


@pytest.mark.parametrize("fault", ["corrupt", "drop"])
def test_a_corrupt_or_cut_projector_download_is_not_trusted(
    fake_hub: FakeHub, files: dict[str, Path], instant_retries: None, fault: str
) -> None:
    repo = f"user/bad-{fault}-GGUF"
    fake_hub.add_repo(repo, {"bad-Q4_K_M.gguf": b"GGUF" + bytes(5000), F16: files[F16]})
    ref = resolve(repo, load_catalog())
    model = fetch.pull(ref, quiet=True).path
    commit, listing = fetch.remote_listing(ref)
    picked = choose_projector(listing, model.name)
    assert picked is not None and picked.path == F16
    if fault == "corrupt":
        fake_hub.add_fault(F16, "corrupt", times=None, offset=1000, data=b"evil")
        expected: type[Exception] = IntegrityError
    else:  # cut after 10 KB, then no byte more: the partial file is kept under a name no run trusts
        size = files[F16].stat().st_size
        fake_hub.add_fault(F16, "drop", times=None, drop_after=lambda left: 10_000 if left == size else 0)
        expected = DownloadError
    with pytest.raises(expected):
        pull_projector(ref, commit, picked, quiet=True)
    assert cached_projector(model) is None
    assert not (model.parent / F16).exists()
    partial = model.resolve().parent / f"{picked.sha256}.incomplete"  # blobs/<sha256>.incomplete
    assert partial.exists() == (fault == "drop") and (fault != "drop" or partial.stat().st_size == 10_000)
    fake_hub.clear_faults()
    assert pull_projector(ref, commit, picked, quiet=True).read_bytes() == files[F16].read_bytes()
    assert cached_projector(model) == model.parent / F16


def test_rm_takes_the_projector_with_the_last_model_that_uses_it(
    fake_hub: FakeHub, files: dict[str, Path], tmp_path: Path
) -> None:
    from tests.synth import write_gguf

    repo = "user/rm-vis-GGUF"
    models = {
        f"rm-{q}.gguf": write_gguf(tmp_path / f"{q}.gguf", layers=n) for n, q in ((1, "Q4_K_M"), (2, "Q8_0"))
    }
    fake_hub.add_repo(repo, {**models, F16: files[F16]})
    for quant in ("Q4_K_M", "Q8_0"):
        done = cli(fake_hub, "pull", f"{repo}:{quant}")
        assert done.returncode == 0, done.stderr
    projector = Path(done.stdout.decode().splitlines()[-1].split("\t")[1])
    assert projector.name == F16 and projector.exists()
    assert cli(fake_hub, "rm", f"{repo}:Q4_K_M", "-y").returncode == 0
    assert projector.exists()  # the Q8_0 model still uses it
    gone = cli(fake_hub, "rm", f"{repo}:Q8_0", "-y")
    assert gone.returncode == 0, gone.stderr
    assert not projector.exists() and not (hub_cache_dir() / "models--user--rm-vis-GGUF").exists()


def test_chat_takes_images_through_the_pulled_projector(
    fake_hub: FakeHub, files: dict[str, Path], pulled: list[str]
) -> None:
    same = ["--temperature", "0", "--max-tokens", "12", "--flash-attn", "off"]  # run's and chat's loads alike
    offline = {**hf_env(fake_hub.endpoint, hub_cache_dir()), "HF_HUB_OFFLINE": "1"}
    image = files["a.png"]
    done = run_cli(
        "chat", REFERENCE, *same, "--no-save", input=f"/image {image}\n{QUESTION}\n".encode(), env=offline
    )
    assert done.returncode == 0, done.stderr
    alone = run_cli("run", REFERENCE, QUESTION, "--image", str(image), *same, env=offline)
    assert alone.returncode == 0, alone.stderr
    assert done.stdout.decode().split("\n\n")[0].strip() == alone.stdout.decode().strip() != ""


def test_run_image_refuses_a_pair_that_will_not_fit_before_fetching_either(
    fake_hub: FakeHub, files: dict[str, Path], smollm2_path: Path
) -> None:
    """Neither file cached, and room for the model but not for its projector beside it (--ctx and
    --kv-type asked, so the plan cannot make room): the refusal
    comes from both headers read remotely, and neither file is downloaded (before: the projector
    was fetched first, then the model's plan refused)."""
    from runner.memory.plan import CPU_MARGIN

    repo = "user/tight-vis-GGUF"
    fake_hub.add_repo(repo, {MODEL_FILE: smollm2_path, F16: files[F16], Q8: files[Q8]})
    fit = ("fit", str(smollm2_path), "--ctx", "2048", "--kv-type", "f16", "--json")
    alone = json.loads(run_cli(*fit).stdout)
    cap = str(int((alone["needs_bytes"] + (1 << 20)) / (1 - CPU_MARGIN)))  # the projector's share is ~4 MB
    done = cli(
        fake_hub, "run", f"{repo}:Q4_K_M", QUESTION, "--image", str(files["a.png"]), "--ctx", "2048",
        "--kv-type", "f16", RUNNER_MEMORY=cap,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 1 and "does not fit" in err and "for the projector" in err, err
    assert not list((hub_cache_dir() / "models--user--tight-vis-GGUF").rglob("*.gguf"))
    # with room, the same command fetches both and answers
    again = cli(fake_hub, "run", f"{repo}:Q4_K_M", QUESTION, "--image", str(files["a.png"]), "--ctx", "2048")
    assert again.returncode == 0, again.stderr
    cached = hub_cache_dir() / "models--user--tight-vis-GGUF"
    assert sorted(p.name for p in cached.rglob("*.gguf")) == sorted([F16, MODEL_FILE])
    # the model cached, another projector named by its Hub reference: refused before it is fetched
    other = cli(
        fake_hub, "run", f"{repo}:Q4_K_M", QUESTION, "--image", str(files["a.png"]), "--ctx", "2048",
        "--kv-type", "f16", "--mmproj", f"{repo}:{Q8}", RUNNER_MEMORY=cap,
    )  # fmt: skip
    assert other.returncode == 1 and "does not fit" in other.stderr.decode(), other.stderr
    assert Q8 not in {p.name for p in cached.rglob("*.gguf")}


def test_a_pulled_audio_model_is_said_to_take_clips(
    fake_hub: FakeHub, smollm2_path: Path, tmp_path: Path
) -> None:
    """The projector pulled with an audio model is named for what it takes, not called a vision one."""
    projector = tmp_path / "mmproj-asr-F16.gguf"
    command = [sys.executable, str(SCRIPT), str(projector), "--for", str(smollm2_path), "--type", "qwen3a"]
    subprocess.run(command, check=True, capture_output=True)
    fake_hub.add_repo("user/asr-GGUF", {"asr-Q4_K_M.gguf": smollm2_path, projector.name: projector})
    done = cli(fake_hub, "pull", "user/asr-GGUF")
    assert done.returncode == 0, done.stderr
    said = done.stderr.decode()
    assert "an audio model, its projector mmproj-asr-F16.gguf beside it (--audio takes clips)" in said, said
    assert "vision" not in said
