"""Schemathesis over the whole API (issue 15 item 11): every operation of the live stack's OpenAPI document, with a
fixed seed and a bounded number of examples, must answer without a server error, with a status the document
declares, a declared content type, and a body that conforms to the declared schema.

It runs Schemathesis's own runner (the ``schemathesis run`` CLI, in a subprocess so the stack's event loop keeps
serving) against the session's real stack. Its calls use an account of their own whose balance is zero: every
launch stops at 402 after validation, so the fuzzer exercises the launch body's checks without starting runs on
the shared stack, and whatever it does to host policy or secrets stays in that account.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from tests.conftest import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")

MAX_EXAMPLES = 30
"""Per operation and phase; generation is deterministic (Schemathesis's fixed-seed mode), so every run sends the
same requests. Measured with 20: 1,211 cases over 27 operations in ~20 s."""
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance")


async def test_whole_api_conforms_to_its_openapi(stack: Stack, tmp_path: Path) -> None:
    engine = make_engine(stack.settings.resolved_database_url())
    _, key = create_account(engine, name="schemathesis", balance_usd=0.0)
    engine.dispose()
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{stack.api_url}/openapi.json",
        "--header", f"Authorization: Bearer {key}",
        "--checks", ",".join(CHECKS),
        "--phases", "examples,coverage,fuzzing",
        "--generation-deterministic", "--max-examples", str(MAX_EXAMPLES),
        # One worker: with two, hypothesis's threads call ast.parse at once, and CPython 3.11 keeps the AST
        # converter's recursion counter per interpreter, not per thread (gh-106905): "SystemError: AST constructor
        # recursion depth mismatch" failed a CI run.
        "--workers", "1", "--request-timeout", "30",
        "--report", "junit", "--report-junit-path", str(tmp_path / "schemathesis.xml"),
    ]
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": ""}, cwd=tmp_path)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
    report = out.decode(errors="replace")
    print(report[-6000:])
    assert proc.returncode == 0, report[-6000:]
