"""The LiteLLM configuration that describes a run's model route (the ModelProxyArtifact's load-bearing part).

Secrets are referenced by environment-variable name (``os.environ/NAME``), never inlined. The credential proxy
(``benchwright.proxy.credential_proxy``) serves the same route: the model string, ``api_base``, ``params`` and
prices here are what it registers, so the artifact stays a LiteLLM config any LiteLLM deployment can load.
"""

from __future__ import annotations

from typing import Any

import yaml

from benchwright.schemas import ModelSpec


def secret_env_name(secret: str) -> str:
    """The environment variable a LiteLLM deployment would read the secret from (the artifact names it so)."""
    return f"BW_SECRET_{secret.upper()}"


def litellm_config(spec: ModelSpec, *, secret_env: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"model": spec.identifier}
    if spec.api_base:
        params["api_base"] = spec.api_base
    if secret_env:
        params["api_key"] = f"os.environ/{secret_env}"
    for price in ("input_cost_per_token", "output_cost_per_token"):
        value = getattr(spec, price)
        if value is not None:
            params[price] = value
    params.update(spec.params)
    return {"model_list": [{"model_name": spec.identifier, "litellm_params": params}]}


def litellm_config_yaml(spec: ModelSpec, *, secret_env: str | None = None) -> str:
    return yaml.safe_dump(litellm_config(spec, secret_env=secret_env), sort_keys=True)
