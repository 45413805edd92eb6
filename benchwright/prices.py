"""Token prices for the SUT: from the launch's model object, else from LiteLLM's bundled price map.

The map is read straight from the JSON file that ships inside the litellm package, so pricing a model does not
pay litellm's multi-second import.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchwright.schemas import ModelSpec


@dataclass(frozen=True)
class Prices:
    input_cost_per_token: float = 0.0
    output_cost_per_token: float = 0.0

    def cost(self, usage: dict[str, int]) -> float:
        return (usage.get("prompt_tokens", 0) * self.input_cost_per_token
                + usage.get("completion_tokens", 0) * self.output_cost_per_token)


@functools.cache
def _litellm_price_map() -> dict[str, Any]:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "model_prices_and_context_window_backup.json"
    try:
        prices: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return prices


def prices_for(spec: ModelSpec) -> Prices:
    """The launch's prices where given, else LiteLLM's for the model string (or its bare name), else zero."""
    known: dict[str, Any] = {}
    if spec.input_cost_per_token is None or spec.output_cost_per_token is None:
        table = _litellm_price_map()
        known = table.get(spec.identifier) or table.get(spec.identifier.split("/", 1)[-1]) or {}
    return Prices(
        input_cost_per_token=_first(spec.input_cost_per_token, known.get("input_cost_per_token")),
        output_cost_per_token=_first(spec.output_cost_per_token, known.get("output_cost_per_token")),
    )


def _first(*values: Any) -> float:
    for v in values:
        if isinstance(v, (int, float)):
            return float(v)
    return 0.0
