"""Conversations to token ids with an assistant-only loss mask, and prompts to generation ids.

Two ways to find the assistant tokens, chosen by the chat template, never silently:

- the template marks assistant turns with ``{% generation %}`` (our tiny models, TRL's
  ``qwen3_training.jinja``): ``apply_chat_template(return_assistant_tokens_mask=True)``;
- otherwise (e.g. Qwen's released templates) by prefix differences: the tokens that rendering
  turns ``[:i+1]`` adds to rendering turns ``[:i]`` with the generation prompt are assistant turn
  ``i``'s. That needs the template to be prefix-consistent (a later turn does not re-render an
  earlier one); where it is not, the error names the turn and says to use a template with
  generation tags.

In both, the mask ends at the turn's last end-of-turn token, so the model learns to stop and the
trailing newline the template adds after ``<|im_end|>`` is not trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ChatError", "TokenizedConversation", "check_messages", "prompt_ids", "read_jsonl", "tokenize_conversation"]

ROLES = ("system", "user", "assistant", "tool")


class ChatError(ValueError):
    """A conversation that cannot be tokenized; the message names the example and the field."""


@dataclass
class TokenizedConversation:
    input_ids: list[int]
    assistant_mask: list[int]  # 1 where the token is trained on (assistant content + its end-of-turn)
    truncated: bool = False


def check_messages(messages: Any, where: str = "conversation") -> list[dict[str, str]]:
    """``messages`` as a list of ``{"role", "content"}`` dicts; a ``ChatError`` naming the bad field otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ChatError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatError(f"{where}: messages[{i}] must be an object, got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ChatError(f"{where}: messages[{i}].role must be one of {ROLES}, got {role!r}")
        if not isinstance(content, str):
            raise ChatError(f"{where}: messages[{i}].content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def _has_generation_tags(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "{% generation %}" in template.replace("{%-", "{%").replace("-%}", "%}").replace("  ", " ")


def _render(tokenizer: Any, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(
        list(messages), tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
    )
    return list(out["input_ids"])


def _trim_after_last_stop(mask: list[int], ids: list[int], start: int, end: int, stop_ids: set[int]) -> None:
    last = max((j for j in range(start, end) if ids[j] in stop_ids), default=None)
    if last is not None:
        for j in range(last + 1, end):
            mask[j] = 0


def tokenize_conversation(
    tokenizer: Any, messages: Any, *, max_length: int | None = None, where: str = "conversation"
) -> TokenizedConversation:
    """Ids and assistant mask of one conversation (truncated to ``max_length`` if given)."""
    msgs = check_messages(messages, where)
    if not any(m["role"] == "assistant" for m in msgs):
        raise ChatError(f"{where}: no assistant message: nothing to train on")
    stop_ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    if _has_generation_tags(tokenizer):
        out = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = list(out["input_ids"]), [int(x) for x in out["assistant_masks"]]
    else:
        ids = _render(tokenizer, msgs, add_generation_prompt=False)
        mask = [0] * len(ids)
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            before = _render(tokenizer, msgs[:i], add_generation_prompt=True) if i else []
            upto = _render(tokenizer, msgs[: i + 1], add_generation_prompt=False)
            if upto[: len(before)] != before or ids[: len(upto)] != upto:
                raise ChatError(
                    f"{where}: the chat template is not prefix-consistent at messages[{i}] (rendering later turns "
                    "changes earlier ones), so assistant tokens cannot be located; use a chat template with "
                    "{% generation %} tags (e.g. TRL's qwen3_training.jinja)"
                )
            for j in range(len(before), len(upto)):
                mask[j] = 1
            _trim_after_last_stop(mask, ids, len(before), len(upto), stop_ids)
    truncated = max_length is not None and len(ids) > max_length
    if truncated:
        ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask):
        raise ChatError(f"{where}: no assistant token left after truncation to max_length={max_length}")
    return TokenizedConversation(ids, mask, truncated)


def prompt_ids(tokenizer: Any, messages: Any, where: str = "prompt") -> list[int]:
    """Ids of a prompt conversation followed by the assistant generation prompt."""
    msgs = check_messages(messages, where)
    if msgs[-1]["role"] == "assistant":
        raise ChatError(f"{where}: the last message is the assistant's; a prompt ends with a user (or tool) turn")
    return _render(tokenizer, msgs, add_generation_prompt=True)


def read_jsonl(path: Any, keys: tuple[str, ...], what: str) -> list[tuple[str, dict[str, Any]]]:
    """``(path:line, object)`` for each non-blank line of a JSONL file; errors name the file, line and key."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data.path: {path} does not exist")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object ({what})")
        for key in keys:
            if key not in row:
                raise ValueError(f"{path}:{n}: missing {key!r} ({what})")
        rows.append((f"{path}:{n}", row))
    if not rows:
        raise ValueError(f"data.path: {path} has no lines")
    return rows
