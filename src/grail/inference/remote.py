"""Answers from an OpenAI-compatible endpoint (``openai:NAME@URL``: ``vllm serve``,
``transformers serve``; ``openai:NAME``: the OpenAI API itself).

The choice distribution (:class:`grail.inference.answers.Answers`): the server's top logprobs
after ``<answer>`` where it returns them, else the empirical distribution of k sampled answers
(smoothed), each answer read by the caller's rule (`parse`). Calls use the ``openai`` client's
own retries with exponential backoff, a concurrency limit, and temperature 0. A dry run prints
what would be sent and sends nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from grail.core.progress import Progress
from grail.core.serving import ModelSpec, first_request, openai_client
from grail.inference.answers import (
    ANSWER_TAG,
    TOP_LOGPROBS,
    Answers,
    distribution_from_top,
    sampled_distribution,
)

logger = logging.getLogger(__name__)


def answer_openai(
    spec: ModelSpec,
    conversations: list[list[dict]],
    options: list[int],
    parse: Callable[[str, int], int | None],
    max_tokens: int,
    concurrency: int,
    samples: int = 8,
    retries: int = 4,
    timeout: float = 60.0,
) -> Answers:
    """Completions from an OpenAI-compatible endpoint (None where a request kept failing) and
        choice distributions: the server's top logprobs after ``<answer>``, else (a server without
        logprobs, or no answer tag) the distribution of `samples` sampled answers, each read by
    `parse` (f(text, options) -> the option number, or None).

        The first request goes alone, so an unreachable endpoint fails at once with a clear message.
    """
    import openai

    client = openai_client(spec, retries, timeout)

    def ask(messages: list[dict], api=client, sample: bool = False):
        choice = api.chat.completions.create(**request(spec, messages, max_tokens, sample)).choices[
            0
        ]
        return reply_text(choice), answer_top(choice)

    if not conversations:
        return Answers([], [], "none")
    # a probe with one retry: an unreachable endpoint fails in about a second
    first = first_request(spec, lambda: ask(conversations[0], client.with_options(max_retries=1)))

    def ask_or_none(messages: list[dict], sample: bool = False):
        try:
            return ask(messages, sample=sample)
        except openai.OpenAIError as err:  # after the client's retries: count it, keep going
            logger.warning("%s: request failed after %d retries: %s", spec.name, retries, err)
            return None, None

    progress = Progress(f"{spec.name}: completions", len(conversations))
    replies = [first]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for reply in pool.map(ask_or_none, conversations[1:]):
            replies.append(reply)
            progress.update(len(replies))
        sampled = sample_missing(replies, conversations, options, parse, samples, pool, ask_or_none)
    distributions = [
        distribution_from_top(top, n) if top is not None else sampled[k]
        for k, ((_, top), n) in enumerate(zip(replies, options, strict=True))
    ]
    method = "option-token logprobs (server, top 20)"
    if sampled:
        method = (
            f"empirical distribution of {samples} samples on {len(sampled)} of "
            f"{len(replies)} rows, logprobs elsewhere"
        )
        if len(sampled) == len(replies):
            method = (
                f"empirical distribution of {samples} samples (the server returned no logprobs)"
            )
    return Answers([text for text, _ in replies], distributions, method)


def request(spec: ModelSpec, messages: list[dict], max_tokens: int, sample: bool = False) -> dict:
    """The chat-completions request body sent for one prompt: greedy with the top logprobs of
    every token (the choice distribution), or one sampled answer at temperature 1."""
    if sample:
        return {
            "model": spec.model,
            "messages": messages,
            "temperature": 1.0,
            "max_tokens": max_tokens,
        }
    return {
        "model": spec.model,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
    }


def answer_top(choice) -> dict[str, float] | None:
    """The top logprobs at the token after ``<answer>`` in a chat choice, when the server
    returned logprobs and the answer tag was written; else None."""
    tokens = (choice.logprobs.content or []) if choice.logprobs is not None else []
    text = ""
    for token in tokens:
        if text.rstrip().endswith(ANSWER_TAG) and token.top_logprobs:
            return {top.token: top.logprob for top in token.top_logprobs}
        text += token.token
    return None


def reply_text(choice) -> str | None:
    """The completion as the model wrote it: servers with a reasoning parser (vLLM,
    transformers serve) move the ``<think>`` part out of the content into ``reasoning_content``
    (or ``reasoning``); it is put back, an empty one ("") as empty tags. A server that sends no
    reasoning field for an empty thought leaves only the content."""
    extra = choice.message.model_extra or {}
    reasoning = next(
        (extra[k] for k in ("reasoning_content", "reasoning") if extra.get(k) is not None), None
    )
    content = choice.message.content
    return f"<think>{reasoning}</think>{content or ''}" if reasoning is not None else content


def sample_missing(
    replies, conversations, options, parse, samples, pool, ask
) -> dict[int, list[float]]:
    """Rows whose reply carried no answer-position logprobs: `samples` answers sampled at
    temperature 1 each, read by `parse`, as a smoothed empirical distribution (row index ->
    distribution)."""
    missing = [k for k, (_, top) in enumerate(replies) if top is None]
    if not missing:
        return {}
    logger.info("no answer logprobs on %d rows: sampling %d answers each", len(missing), samples)
    asked = [k for k in missing for _ in range(samples)]
    texts = list(pool.map(lambda k: ask(conversations[k], sample=True)[0], asked))
    return {
        k: sampled_distribution(
            [parse(t or "", options[k]) for t in texts[i * samples : (i + 1) * samples]],
            options[k],
        )
        for i, k in enumerate(missing)
    }


def dry_run(spec: ModelSpec, conversations: list[list[dict]], max_tokens: int) -> str:
    """What a run would send, without sending anything."""
    first = json.dumps(request(spec, conversations[0], max_tokens), indent=1, ensure_ascii=False)
    return (
        f"[dry run] {spec.name}: {len(conversations)} chat-completions requests to "
        f"{spec.base_url or 'https://api.openai.com/v1'}; the first:\n{first}"
    )
