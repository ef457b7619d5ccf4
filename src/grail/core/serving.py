"""Models behind an OpenAI-compatible endpoint (``vllm serve``, ``transformers serve``, the
OpenAI API): what ``--model openai:NAME[@URL]`` names, the client, and the one-line error for an
endpoint that cannot be reached. Generation and the benchmark both ask models this way."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from grail.core.errors import GrailError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """One model to evaluate or generate with."""

    name: str
    kind: str  # "local" or "openai"
    path: str | None = None  # local folder
    model: str | None = None  # remote model name
    base_url: str | None = None  # None: the OpenAI API
    step: int | None = None  # training step, for checkpoints
    series: str | None = None  # the training run a checkpoint belongs to
    asked_as: str | None = None  # folder whose prompt.json says how to ask it (step 0)


def openai_spec(spec: str) -> ModelSpec:
    """``openai:NAME@URL`` (an endpoint) or ``openai:NAME`` (the OpenAI API, which needs
    ``OPENAI_API_KEY``).

    >>> openai_spec("openai:tiny@http://127.0.0.1:8000/v1").base_url
    'http://127.0.0.1:8000/v1'
    """
    name, _, url = spec.removeprefix("openai:").partition("@")
    if not spec.startswith("openai:") or not name:
        raise GrailError(f"--model {spec}: expected openai:NAME or openai:NAME@URL")
    if not url and not os.environ.get("OPENAI_API_KEY"):
        raise GrailError(
            f"--model {spec}: the OpenAI API needs OPENAI_API_KEY in the "
            "environment (or give an endpoint: openai:NAME@URL)"
        )
    return ModelSpec(
        name if not url else f"{name}@{url}", "openai", model=name, base_url=url or None
    )


def openai_client(spec: ModelSpec, retries: int, timeout: float):
    """The openai client for the spec's endpoint (the key from ``OPENAI_API_KEY``; a local
    server takes any)."""
    import openai

    return openai.OpenAI(
        base_url=spec.base_url,
        api_key=os.environ.get("OPENAI_API_KEY") or "not-needed",
        max_retries=retries,
        timeout=timeout,
    )


def unreachable(spec: ModelSpec) -> GrailError:
    return GrailError(f"{spec.name}: cannot reach {spec.base_url or 'the OpenAI API'}")


def first_request(spec: ModelSpec, call):
    """`call()`, the first request to an endpoint, sent alone (with one retry): an endpoint
    that cannot be reached, or that refuses the model, fails at once in one line."""
    import openai

    try:
        return call()
    except openai.APIConnectionError:
        raise unreachable(spec) from None
    except openai.APIStatusError as err:
        raise GrailError(
            f"{spec.name}: the endpoint answered {err.status_code}: {str(err.message)[:200]}"
        ) from None


def chat_replies(
    spec: ModelSpec,
    conversations: list[list[dict]],
    max_tokens: int,
    concurrency: int = 8,
    retries: int = 4,
    timeout: float = 120.0,
) -> list[str | None]:
    """Greedy replies of an endpoint to every conversation; None where a request still failed
    after the client's retries (the caller counts them). The first request goes alone, so an
    unreachable endpoint fails at once in one line."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    client = openai_client(spec, retries, timeout)

    def ask(messages: list[dict], api=client) -> str:
        reply = api.chat.completions.create(
            model=spec.model, messages=messages, temperature=0, max_tokens=max_tokens
        )
        return reply.choices[0].message.content or ""

    def ask_or_none(messages: list[dict]) -> str | None:
        try:
            return ask(messages)
        except openai.OpenAIError as err:
            logger.warning("%s: request failed after %d retries: %s", spec.name, retries, err)
            return None

    if not conversations:
        return []
    first = first_request(spec, lambda: ask(conversations[0], client.with_options(max_retries=1)))
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return [first, *pool.map(ask_or_none, conversations[1:])]
