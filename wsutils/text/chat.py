"""The second panel of the paper's Figure 1 (the book's chapter ``figure-1``): a chat model
asked whether a review is
positive, then whether it is negative — two prompts that differ in one word — answers "No"
and then "Yes". Runs only when a chat model is available (``WSBOOK_CHAT_MODEL``, read by
:func:`wsutils.run.config.chat_model`).

:func:`answer_probabilities` reads the model's next-token distribution right after the prompt
(greedy decoding, as the authors' ``top_k=1``, would emit its most likely token) and returns the
probabilities of the first token of each candidate answer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

__all__ = [
    "ChatModel",
    "SYSTEM_TEMPLATE",
    "answer_probabilities",
    "load_chat_model",
    "sentiment_prompts",
]

# The authors' system prompt (their llama2 notebook), with the one word that changes.
SYSTEM_TEMPLATE = (
    'Reply with "Yes" if the review I will provide you is {word}, and "No" otherwise.'
)


@dataclass(frozen=True)
class ChatModel:
    name: str
    tokenizer: Any
    model: Any


@functools.lru_cache(maxsize=2)
def _load(name: str, device: str) -> ChatModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name)
    except OSError as err:
        raise RuntimeError(
            f"chat model {name!r} could not be loaded ({err}). Set WSBOOK_CHAT_MODEL to a local "
            "directory holding a causal chat model, or to a hub name with the hub reachable "
            "(HF_HUB_OFFLINE unset), or unset it to skip this panel."
        ) from None
    model.eval().to(device)
    return ChatModel(name=name, tokenizer=tokenizer, model=model)


def load_chat_model(name: str, *, device=None) -> ChatModel:
    """A causal LM and its tokenizer (``transformers.AutoModelForCausalLM``), loaded once."""
    return _load(str(name), str(torch.device(device or "cpu")))


def sentiment_prompts(review: str, words: Sequence[str] = ("positive", "negative")):
    """``(system, user)`` pairs asking about ``review``, one per word: the prompts differ in
    that one word only."""
    user = f"Review:\n\n{review}\n"
    return [(SYSTEM_TEMPLATE.format(word=w), user) for w in words]


def _render(tok, system: str, user: str) -> str:
    if getattr(tok, "chat_template", None):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system}\n\n{user}\n"


def answer_probabilities(
    chat: ChatModel, prompts, answers: Sequence[str] = ("No", "Yes")
) -> np.ndarray:
    """``P(first token of answer | prompt)`` for each ``(system, user)`` prompt and answer:
    an array ``(len(prompts), len(answers))``. The prompt goes through the tokenizer's chat
    template when it has one (plain text otherwise)."""
    tok, model = chat.tokenizer, chat.model
    first = []
    for a in answers:
        ids = tok.encode(a, add_special_tokens=False)
        if not ids:
            raise ValueError(f"answer {a!r} has no tokens for {chat.name}.")
        first.append(ids[0])
    if len(set(first)) != len(first):
        raise ValueError(f"answers {list(answers)} share their first token for {chat.name}.")
    device = next(model.parameters()).device
    out = np.empty((len(prompts), len(answers)))
    for j, (system, user) in enumerate(prompts):
        text = _render(tok, system, user)
        enc = tok(
            text, return_tensors="pt", add_special_tokens=not getattr(tok, "chat_template", None)
        )
        with torch.no_grad():
            logits = model(**enc.to(device)).logits[0, -1]
        probs = torch.softmax(logits.double(), dim=-1)
        out[j] = probs[first].cpu().numpy()
    return out
