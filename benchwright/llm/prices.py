"""Token prices, the one pricing home (issue 23): what a model's tokens cost, for every provider.

A model's per-token prices are the launch's own (``model.input_cost_per_token`` / ``output_cost_per_token``) where
given, else LiteLLM's cost map's for the model string, whichever provider serves it (``openai/...``,
``anthropic/...``, ``bedrock/...``). The credential proxy registers every run's route with these prices and meters
each call's reported usage with them (``Prices.cost``): the same figure for an OpenAI-compatible endpoint and for a
LiteLLM-routed provider, never what the provider's reply says its model is.

A model the map does not price costs nothing only when nothing depends on its cost: a launch with a cost limit
(``run.cost``, ``task.cost``, ``constraints.max_cost_cents``) and an unpriced model is refused (``check_priced``).

The map is read straight from the JSON file that ships inside the litellm package, so pricing a model does not
pay litellm's multi-second import.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchwright.errors import InvalidInput

if TYPE_CHECKING:  # the credential proxy imports Prices: it stays light (no pydantic models)
    from benchwright.runs.limits import RunLimits
    from benchwright.schemas import ModelSpec


@dataclass(frozen=True)
class Prices:
    input_cost_per_token: float = 0.0
    output_cost_per_token: float = 0.0

    def cost(self, usage: object) -> float:
        """USD for one call's ``usage`` (OpenAI's names: ``prompt_tokens``, ``completion_tokens``); a usage that
        is missing or malformed costs nothing (a count that is not a finite, non-negative number is ignored)."""
        if not isinstance(usage, dict):
            return 0.0
        return (_tokens(usage.get("prompt_tokens")) * self.input_cost_per_token
                + _tokens(usage.get("completion_tokens")) * self.output_cost_per_token)


def _tokens(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return 0.0
    return float(value)


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


def cost_map_prices(identifier: str) -> Prices | None:
    """LiteLLM's price for a model string, or None when the map does not price it: the string as given
    (``bedrock/...`` keys carry their provider), else its bare model name (``anthropic/claude-sonnet-4-5`` is
    listed as ``claude-sonnet-4-5``)."""
    table = _litellm_price_map()
    candidates = [table.get(identifier), table.get(identifier.split("/", 1)[-1])]
    for known in candidates:
        if not isinstance(known, dict):
            continue
        inp, out = known.get("input_cost_per_token"), known.get("output_cost_per_token")
        if isinstance(inp, (int, float)) and isinstance(out, (int, float)) and _price(inp) and _price(out):
            return Prices(input_cost_per_token=float(inp), output_cost_per_token=float(out))
    return None


def _price(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def prices_for(spec: ModelSpec) -> Prices:
    """The launch's prices where given, else LiteLLM's for the model string, else zero (``check_priced`` refuses
    the zero where a cost limit depends on it)."""
    known = cost_map_prices(spec.identifier) if (spec.input_cost_per_token is None
                                                 or spec.output_cost_per_token is None) else None
    return Prices(
        input_cost_per_token=_first(spec.input_cost_per_token, known.input_cost_per_token if known else None),
        output_cost_per_token=_first(spec.output_cost_per_token, known.output_cost_per_token if known else None),
    )


def is_priced(spec: ModelSpec) -> bool:
    """Whether both of the model's token prices are known (the launch's or the cost map's)."""
    given = spec.input_cost_per_token is not None and spec.output_cost_per_token is not None
    return given or cost_map_prices(spec.identifier) is not None


def check_priced(spec: ModelSpec, limits: RunLimits) -> None:
    """Refuse a launch whose cost limit would watch a model nobody can price (its spend would read $0 forever).

    Raises:
        InvalidInput: ``unpriced_model``, naming the model and how to give it a price.
    """
    limited = [name for name, value in (("limits.run.cost", limits.run_cost_usd),
                                        ("limits.task.cost", limits.task.cost_usd)) if value is not None]
    if not limited or is_priced(spec):
        return
    raise InvalidInput(
        f"model '{spec.identifier}' has no known price (LiteLLM's cost map does not list it), so "
        f"{' and '.join(limited)} could never be reached; give its price in the launch: "
        '"model": {"identifier": ..., "input_cost_per_token": <USD>, "output_cost_per_token": <USD>} '
        "(benchwright run: --input-cost-per-token, --output-cost-per-token)",
        code="unpriced_model")


def _first(*values: Any) -> float:
    for v in values:
        if isinstance(v, (int, float)):
            return float(v)
    return 0.0
