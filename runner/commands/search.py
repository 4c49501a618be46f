"""`runner search`: GGUF model repos on the Hub whose names match some text, most downloaded first."""

from __future__ import annotations

import json
from typing import Any, TextIO

from runner import ui
from runner.errors import DownloadError
from runner.hub import fetch

COLUMNS = ("REPO", "DOWNLOADS", "LIKES")


def search_hub(text: str, *, out: TextIO, limit: int, as_json: bool = False) -> None:
    """Up to limit repos, one row each (a table, or a JSON list with as_json); a note when none match."""
    found = find_repos(text, limit=limit)
    if as_json:
        out.write(json.dumps(found, indent=2) + "\n")
    elif found:
        rows = [(r["repo"], f"{r['downloads']:,}", f"{r['likes']:,}") for r in found]
        ui.table_to(out, COLUMNS, rows, right={"DOWNLOADS", "LIKES"})
    if not found:
        ui.info(f"no GGUF repos on the Hub match {text!r}")


def find_repos(text: str, *, limit: int) -> list[dict[str, Any]]:
    """[{repo, downloads, likes}], most downloaded first."""
    import httpx2  # huggingface_hub's HTTP stack: its network errors are not OSErrors
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    if fetch.env_offline():
        raise DownloadError("cannot search the Hugging Face Hub: runner is offline (HF_HUB_OFFLINE)")
    reason = fetch.hub_unreachable()  # at most 3 s, where huggingface_hub would retry for ~25 s
    if reason is not None:
        raise DownloadError(f"cannot search the Hugging Face Hub: it cannot be reached ({reason})")
    api = HfApi(endpoint=constants.ENDPOINT)
    try:
        models = fetch.api_call(
            lambda: list(api.list_models(search=text, filter="gguf", sort="downloads", limit=limit))
        )
    except HfHubHTTPError as exc:
        denied = fetch.access_denied(exc)
        if denied is not None:
            raise denied from exc
        raise DownloadError(f"cannot search the Hugging Face Hub: {fetch.first_line(exc)}") from exc
    except json.JSONDecodeError as exc:  # a body that is not the JSON it should be
        raise DownloadError(
            f"cannot search the Hugging Face Hub: it sent a malformed answer ({exc})"
        ) from exc
    except (httpx2.HTTPError, OSError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DownloadError(f"cannot search the Hugging Face Hub: {first_line}") from exc
    return [{"repo": m.id, "downloads": m.downloads or 0, "likes": m.likes or 0} for m in models]
