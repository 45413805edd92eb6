"""Prompt launches from the CLI (issue 22): `run --prompt ... --watch` says which dataset Find resolved the words
to, and why, before the progress bar; words that match no entry end with the nearest entries, descriptions
included ("capital cities quiz" names the trivia set, whose description says "capitals")."""

from __future__ import annotations

import pytest

from tests.cli.test_cli_launch import api_env, bw
from tests.conftest import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_watch_says_what_find_resolved_and_why_before_the_progress(stack: Stack) -> None:
    done = await bw("run", "--prompt", "trivia, the first 3", "--model", "openai/dev", "--api-base", stack.dev_url,
                    "--watch", env=api_env(stack))
    assert "of 3" in done.out, done.out + done.err
    said = done.err.index("dataset: trivia-mini (catalog:trivia-mini)")
    assert "why: the prompt names it ('trivia')" in done.err
    assert said < done.err.index("launched run") + 200  # right after the launch line
    assert "pass rate" not in done.err[:said]  # no progress drawn before it


async def test_a_prompt_matching_nothing_lists_the_description_near_miss_first(stack: Stack) -> None:
    done = await bw("run", "--prompt", "capital cities quiz", "--model", "openai/dev", "--api-base", stack.dev_url,
                    "--watch", env=api_env(stack))
    assert done.rc == 1
    assert "dataset:" not in done.err
    nearest = done.out.split("the nearest are: ", 1)[1]
    assert nearest.startswith("'trivia-mini'"), done.out
