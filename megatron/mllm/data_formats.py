# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Sample types of real data, and the prompt formats (``--prompt-format``) their text takes.

A sample of an Energon dataset is one ``json`` part, whose ``type`` says what it is, and its
media parts:

- ``caption`` (image-text): ``{"type": "caption", "caption": TEXT}`` and one image part
  (``png``, ``jpg``, ``jpeg`` or ``webp``);
- ``audio_caption`` (audio-text, speech or captions): ``{"type": "audio_caption", "caption":
  TEXT}`` (or ``"text"``) and one ``flac`` or ``wav`` part;
- ``vqa`` (visual question answering): ``{"type": "vqa", "context": QUESTION, "answer":
  ANSWER}`` and one image part;
- ``interleaved`` (a document of text runs and media in reading order): ``{"type":
  "interleaved", "sequence": [TEXT, {"media": PART}, TEXT, ...]}``, each ``PART`` a part of the
  sample (``img0.png``, ``clip1.flac``) whose extension says its modality; ``{"role": "user"}``
  and ``{"role": "assistant"}`` entries start the turns of a chat (``--prompt-format chat``).

The prompt format wraps the text in the tokens the tokenizer defines:

- ``caption`` (the default): ``<s> TEXT </s>``. A caption sample's item sits half-way through
  its text, as before any layout existed; a VQA sample is ``<s> [image] QUESTION ANSWER </s>``
  (a space between the two);
  an interleaved document is ``<s>`` and its sequence in order, then ``</s>`` (its role
  entries hold no text).
- ``chat``: user and assistant turns (:data:`~megatron.mllm.tokenizer.CHAT_TOKENS`):
  ``<s> <|user|> [item] <|end|> <|assistant|> CAPTION <|end|> </s>`` for captions,
  ``<s> <|user|> [image] QUESTION <|end|> <|assistant|> ANSWER <|end|> </s>`` for VQA; an
  interleaved document is a turn per role entry (``<|end|>`` closes each), what comes before the
  first one a user's turn (the whole document, when it has none). The loss scores only the
  assistant's turns: their text and the ``<|end|>`` closing each (``batch.ChatTurns``); user
  turns, the turn-opening tokens and ``</s>`` are not targets.

A caption's, question's or answer's text may hold the placeholder ``<image>`` (``<audio>`` for
audio), token ids 3 and 4: the item then sits there instead of the format's default place, and
the placeholder itself is not a text token. An interleaved document places its items with
``{"media": PART}`` entries, so a placeholder in its text is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from orchestration.workload import WorkloadError

IMAGE_PARTS = ("png", "jpg", "jpeg", "webp")
"""WebDataset extensions read as images."""

AUDIO_PARTS = ("flac", "wav")
"""WebDataset extensions read as audio."""

SAMPLE_TYPES = ("caption", "audio_caption", "vqa", "interleaved")
"""The sample types read."""

PROMPT_FORMATS = ("caption", "chat")
"""The ``--prompt-format`` values."""

PLACEHOLDERS = {"image": "<image>", "audio": "<audio>"}
"""The placeholder token of each modality's items."""

_ITEM = object()  # where a template puts its sample's one item when the text places none

_ROLE = object()  # (_ROLE, "user" | "assistant"): a turn of a chat starts there

ROLES = ("user", "assistant")
"""The roles of an interleaved document's ``{"role": ROLE}`` entries."""


class DataError(WorkloadError):
    """A sample of the dataset that cannot be read; the message names its shard and key."""


@dataclass(frozen=True)
class RawSample:
    """One sample as read from its shard: metadata inputs and still-encoded media."""

    name: str
    """``shard/key`` (behind the dataset's name in a blend): its id in logs and errors."""

    text_ids: tuple[int, ...]
    """Token ids of its text in order, template tokens included, placeholders not."""

    media: tuple[tuple[str, bytes], ...]
    """``(modality, encoded bytes)`` of each item, in document order."""

    text_runs: tuple[int, ...] | None
    """Text tokens before each item and after the last (``SampleMeta.text_runs``), or None
    for the even split around the items (a caption in the ``caption`` format)."""

    item_order: tuple[str, ...] | None
    """The modality of each item in document order, or None where there is one item."""


def modality_of_part(part: str) -> str | None:
    """The modality of a WebDataset part by its extension (``img0.png``: image), or None."""
    ext = part.rsplit(".", 1)[-1].lower()
    return "image" if ext in IMAGE_PARTS else "audio" if ext in AUDIO_PARTS else None


def read_sample(sample: Mapping[str, Any], name: str, tokenizer, prompt_format: str) -> RawSample:
    """The text ids, layout and encoded media of a sample read from its shard.

    Args:
        sample: the sample's parts (Energon's raw dict: ``json`` and media bytes).
        name: ``shard/key``, for errors.
        tokenizer: a :class:`~megatron.mllm.tokenizer.TextTokenizer`.
        prompt_format: one of :data:`PROMPT_FORMATS`.

    Raises:
        DataError: naming the sample, for a missing or malformed field, an unknown type, or
            placeholders that do not match its items.
    """
    if "json" not in sample:
        raise DataError(f"sample {name}: missing field 'json'")
    try:
        info = json.loads(sample["json"])
    except ValueError as e:
        raise DataError(f"sample {name}: field 'json' is not JSON ({e})") from e
    kind = info.get("type") if isinstance(info, dict) else None
    if kind not in SAMPLE_TYPES:
        raise DataError(
            f"sample {name}: sample type {kind!r} cannot be read (known: "
            f"{', '.join(SAMPLE_TYPES)})"
        )
    if kind == "interleaved":
        pieces = _document(sample, info, name)
    else:
        pieces = _single_item(sample, info, kind, name)
    chat = prompt_format == "chat"
    tk = tokenizer
    bos, eos = tk.token_id("<s>"), tk.token_id("</s>")
    if chat:
        prompt, reply = pieces
        turns = [*prompt, *([(_ROLE, "assistant"), *reply] if reply else [])]
        template = [bos, *_turns(turns, tk), eos]
    else:  # a space between a question and its answer, as a reader would write them
        reply = [" " + pieces[1][0]] if kind == "vqa" else pieces[1]
        prompt = [p for p in pieces[0] if not (isinstance(p, tuple) and p[0] is _ROLE)]
        template = [bos, *prompt, *reply, eos]
    flat, placed = _tokenize(template, tk, name)
    if kind in ("caption", "audio_caption") and not chat and not placed:
        # No placeholder: the item sits half-way through the text, as it always has.
        media = tuple(x for x in flat if isinstance(x, tuple))
        ids = tuple(x for x in flat if isinstance(x, int))
        return RawSample(name, ids, media, None, None)
    return _laid_out(flat, name)


def _single_item(sample, info, kind, name) -> tuple[list, list]:
    """``(prompt, reply)`` pieces of a caption, audio-caption or VQA sample."""
    parts = AUDIO_PARTS if kind == "audio_caption" else IMAGE_PARTS
    part = next((p for p in parts if p in sample), None)
    if part is None:
        raise DataError(
            f"sample {name}: a {kind} sample needs one of the fields {', '.join(parts)}"
        )
    item = (_ITEM, "audio" if kind == "audio_caption" else "image", sample[part])
    if kind == "vqa":
        question, answer = (_string(info, key, name) for key in ("context", "answer"))
        return [item, question], [answer]
    text = info.get("caption", info.get("text"))
    if not isinstance(text, str):
        raise DataError(f"sample {name}: missing field 'caption' (a string) in 'json'")
    return [item], [text]


def _document(sample, info, name) -> tuple[list, list]:
    """The pieces of an interleaved document: its sequence, in order (all prompt)."""
    sequence = info.get("sequence")
    if not isinstance(sequence, list):
        raise DataError(f"sample {name}: missing field 'sequence' (a list) in 'json'")
    pieces: list = []
    for j, entry in enumerate(sequence):
        if isinstance(entry, str):
            pieces.append(entry)
            continue
        if isinstance(entry, dict) and len(entry) == 1 and "role" in entry:
            if entry["role"] not in ROLES:
                raise DataError(
                    f"sample {name}: 'sequence'[{j}] has role {json.dumps(entry['role'])[:30]}; "
                    f"a role is {' or '.join(ROLES)}"
                )
            pieces.append((_ROLE, entry["role"]))
            continue
        part = entry.get("media") if isinstance(entry, dict) and len(entry) == 1 else None
        if not isinstance(part, str):
            raise DataError(
                f"sample {name}: 'sequence'[{j}] must be a text string or {{\"media\": PART}}, "
                f"got {json.dumps(entry)[:60]}"
            )
        modality = modality_of_part(part)
        if modality is None:
            raise DataError(
                f"sample {name}: 'sequence'[{j}] names part {part!r}, which is not an image "
                f"({', '.join(IMAGE_PARTS)}) or audio ({', '.join(AUDIO_PARTS)})"
            )
        if part not in sample:
            raise DataError(f"sample {name}: 'sequence'[{j}] names a missing field {part!r}")
        pieces.append(("media", modality, sample[part]))
    return pieces, []


def _turns(pieces: list, tokenizer) -> list:
    """Chat turns around pieces: each ``(_ROLE, role)`` closes the turn before it with
    ``<|end|>`` and opens one of its role; pieces before any role are a user's turn."""
    from megatron.mllm.tokenizer import CHAT_TOKENS

    user, assistant, end = (tokenizer.token_id(t) for t in CHAT_TOKENS)
    opens = {"user": user, "assistant": assistant}
    out: list = []
    for piece in pieces:
        role = piece[1] if isinstance(piece, tuple) and piece[0] is _ROLE else None
        if role is not None or not out:
            out += [end] if out else []
            out.append(opens[role or "user"])
        if role is None:
            out.append(piece)
    return out + [end] if out else [opens["user"], end]


def _string(info, key, name) -> str:
    value = info.get(key)
    if not isinstance(value, str):
        raise DataError(f"sample {name}: missing field {key!r} (a string) in 'json'")
    return value


def _tokenize(template: list, tokenizer, name: str) -> tuple[list, bool]:
    """Template pieces as token ids (ints) and items (``(modality, bytes)``) in sequence order,
    and whether a placeholder in the text placed the sample's one item (it then replaces the
    placeholder, and the template's default place holds nothing)."""
    placeholder = {tokenizer.token_id(t): m for m, t in PLACEHOLDERS.items()}
    flat: list = []
    default = None
    for piece in template:
        if isinstance(piece, int):
            flat.append(piece)
        elif isinstance(piece, str):
            for t in tokenizer.encode(piece):
                flat.append(("marker", placeholder[t]) if t in placeholder else t)
        elif piece[0] is _ITEM:
            default = (piece[1], piece[2])
            flat.append(_ITEM)
        else:
            flat.append((piece[1], piece[2]))
    markers = [x[1] for x in flat if isinstance(x, tuple) and x[0] == "marker"]
    if default is None:  # an interleaved document: its items are its media entries
        if markers:
            raise DataError(
                f"sample {name}: its text holds the placeholder {PLACEHOLDERS[markers[0]]}; "
                'an interleaved document places its items with {"media": PART} entries'
            )
        return flat, False
    modality, media = default
    if markers and (len(markers) > 1 or markers[0] != modality):
        found = ", ".join(PLACEHOLDERS[m] for m in markers)
        raise DataError(
            f"sample {name}: its text holds the placeholders {found}; its one {modality} "
            f"takes at most one {PLACEHOLDERS[modality]}"
        )

    def place(x):
        if x is _ITEM:
            return [] if markers else [(modality, media)]
        return [(modality, media)] if isinstance(x, tuple) else [x]

    return [y for x in flat for y in place(x)], bool(markers)


def _laid_out(flat: list, name: str) -> RawSample:
    """A sample with its text runs, from token ids and items in sequence order."""
    ids, media, runs, run = [], [], [], 0
    for x in flat:
        if isinstance(x, tuple):
            media.append(x)
            runs.append(run)
            run = 0
        else:
            ids.append(x)
            run += 1
    runs.append(run)
    order = tuple(m for m, _ in media) if len(media) > 1 else None
    return RawSample(name, tuple(ids), tuple(media), tuple(runs), order)
