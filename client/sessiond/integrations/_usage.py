"""Token usage from what the SDKs hand their stores, as sessiond `tokens.recorded` data.

sessiond knows no prices: a drop-in's cost is 0 (unknown) unless it is given `prices`,
a table of model name -> (USD per million input tokens, USD per million output tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Prices = Mapping[str, tuple[float, float]]


def tokens(input_tokens: int, output_tokens: int, model: str | None,
           prices: Prices | None) -> dict[str, Any] | None:
    """The tokens.recorded data for one use of a model (None when it used nothing); the
    cost from `prices` when the model is in it, else 0."""
    if not input_tokens and not output_tokens:
        return None
    data: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if model:
        data["model"] = model
    price = prices.get(model) if prices and model else None
    if price is not None:
        data["estimated_cost"] = (input_tokens * price[0] + output_tokens * price[1]) / 1e6
    return data
