"""Spend through LiteLLM-routed providers is metered (issue 23 item 2): a run against an Anthropic-shaped endpoint (a
loopback test double speaking the Messages wire format, reached through LiteLLM's ``anthropic`` provider) records
``cost.model`` = tokens × LiteLLM's cost-map price, ``limits.run.cost`` halts it, and a model with no known price
is refused at launch when a cost limit is set, or priced by the launch body."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from benchwright.llm.prices import cost_map_prices
from benchwright.testkit.anthropic_double import AnthropicDouble, AnthropicDoubleConfig, start_anthropic_double
from benchwright.testkit.devmodel import load_answers
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
MODEL = "anthropic/claude-sonnet-4-5"
"""Priced in LiteLLM's bundled cost map (``LITELLM_LOCAL_MODEL_COST_MAP``): the figures below are read from it."""
REAL_KEY = "sk-ant-double-" + "7" * 20
IN_TOKENS, OUT_TOKENS = 100_000, 20_000
REPLY_MODEL = "claude-haiku-4-5"
"""What the double's answers say they are: a cheaper model in the cost map. The endpoint is the launcher's (its
``api_base``), so its word on the model must not set the price: the launch's model string does."""


@pytest_asyncio.fixture(loop_scope="session")
async def anthropic(stack: Stack, dev_models: DevModels) -> AsyncIterator[AnthropicDouble]:
    double = await start_anthropic_double(AnthropicDoubleConfig(
        answers=load_answers(SAMPLE / "arithmetic.jsonl"), input_tokens=IN_TOKENS, output_tokens=OUT_TOKENS,
        api_key=REAL_KEY, reply_model=REPLY_MODEL))
    address = double.url.removeprefix("http://")
    dev_models.allowed.append(address)  # the operator listed it, like every loopback model endpoint of the tests
    async with stack.http() as http:
        made = await http.post("/v1/secrets", json={"name": f"ANTHROPIC_{uuid.uuid4().hex[:8]}", "value": REAL_KEY})
        assert made.status_code == 201, made.text
        double.secret_name = made.json()["name"]  # type: ignore[attr-defined]
    yield double
    dev_models.allowed.remove(address)
    await double.close()


def _model(double: AnthropicDouble, **extra: object) -> dict[str, object]:
    return {"identifier": MODEL, "api_base": double.url, "secret": double.secret_name, **extra}  # type: ignore[attr-defined]


async def test_anthropic_routed_run_records_cost_model_from_the_cost_map(stack: Stack,
                                                                         anthropic: AnthropicDouble) -> None:
    prices = cost_map_prices(MODEL)
    assert prices is not None and prices.input_cost_per_token > 0, "the cost map prices the model"
    cheap = cost_map_prices(REPLY_MODEL)
    assert cheap is not None and cheap.input_cost_per_token < prices.input_cost_per_token
    per_call = IN_TOKENS * prices.input_cost_per_token + OUT_TOKENS * prices.output_cost_per_token
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": _model(anthropic), "metadata": {"limit": 5}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        tasks = (await http.get(f"/v1/runs/{run['id']}/tasks")).json()["tasks"]
    assert final["status"] == "ok", final
    assert final["tasks"]["summary"]["passed"] == 5, final["tasks"]
    scored = [r for r in anthropic.requests if r["body"]["max_tokens"] != 1]  # Attach's probe asks for 1 token
    assert all(r["headers"]["x-api-key"] == REAL_KEY for r in anthropic.requests)
    calls = len(anthropic.requests)
    assert calls >= 5 and len(scored) >= 5
    assert final["cost"]["model"] == pytest.approx(per_call * len(tasks), rel=1e-9), (final["cost"], calls)


async def test_run_cost_limit_halts_an_anthropic_routed_run(stack: Stack, anthropic: AnthropicDouble) -> None:
    prices = cost_map_prices(MODEL)
    assert prices is not None
    per_call = IN_TOKENS * prices.input_cost_per_token + OUT_TOKENS * prices.output_cost_per_token
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": _model(anthropic), "concurrency": 1,
                                  "metadata": {"limit": 30}, "limits": {"run": {"cost": 2.5 * per_call}}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["halted"] and final["halt_reason"] == "limit_exceeded:run.cost", final
    assert final["cost"]["model"] >= 2.5 * per_call
    assert final["tasks"]["summary"]["passed"] + final["tasks"]["summary"]["failed"] < 30, "halted before the end"


async def test_an_unpriced_model_with_a_cost_limit_is_refused_or_priced_by_the_launch(
        stack: Stack, anthropic: AnthropicDouble) -> None:
    unpriced = {**_model(anthropic), "identifier": "anthropic/claude-house-finetune-7"}
    async with stack.http() as http:
        refused = await http.post("/v1/runs", json={"dataset": DATASET, "model": unpriced,
                                                    "limits": {"run": {"cost": 1.0}}})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "unpriced_model"
        assert "anthropic/claude-house-finetune-7" in error["message"]
        assert "input_cost_per_token" in error["message"] and "output_cost_per_token" in error["message"]
        priced = {**unpriced, "input_cost_per_token": 2e-6, "output_cost_per_token": 1e-5}
        run = await launch(http, {"dataset": DATASET, "model": priced, "metadata": {"limit": 2},
                                  "limits": {"run": {"cost": 100.0}}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok", final
    assert final["cost"]["model"] == pytest.approx(2 * (IN_TOKENS * 2e-6 + OUT_TOKENS * 1e-5), rel=1e-9)
