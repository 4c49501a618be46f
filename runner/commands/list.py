"""`runner list`: every cached model, one row each (a table on a terminal, tab-separated when piped)."""

from __future__ import annotations

import json
from typing import TextIO

from runner import ui
from runner.hub.cache import cached_models
from runner.hub.catalog import load_catalog

COLUMNS = ("REFERENCE", "QUANT", "SIZE", "LAST USED", "VISION")
EMPTY_HINT = "no models cached yet; try runner pull smollm2"


def list_models(*, out: TextIO, as_json: bool = False) -> None:
    """Every cached model, one row each, on out; a hint on stderr when there is none."""
    models = cached_models(load_catalog(), warn=True)
    if as_json:
        out.write(json.dumps([m.to_json() for m in models], indent=2) + "\n")
    elif models:
        rows = [
            (
                m.reference,
                m.quant or "?",
                ui.human_bytes(m.size_bytes),
                ui.human_when(m.last_used),
                "yes" if m.projector is not None else "-",  # its projector pulled with it: --image works
            )
            for m in models
        ]
        ui.table_to(out, COLUMNS, rows, right={"SIZE"})
    if not models:
        ui.info(EMPTY_HINT)
