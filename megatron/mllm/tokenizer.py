# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Text tokenization for real data: ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR``.

The tokenizer is a ``tokenizer.json`` of the Hugging Face ``tokenizers`` library in a local
directory (nothing is downloaded). Its first ids are reserved, in this order, so that they agree
with the packer of :mod:`megatron.mllm.batch`: ``<pad>`` (0, the placeholder at item positions
and padding), ``<s>`` (1, opens every sample), ``</s>``, ``<image>`` and ``<audio>``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from megatron.mllm.arguments import ConfigError

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<image>", "<audio>")
"""Special tokens every OrchWeave tokenizer has, at ids 0, 1, 2, ... in this order."""

CHAT_TOKENS: tuple[str, ...] = ("<|user|>", "<|assistant|>", "<|end|>")
"""The turn tokens ``--prompt-format chat`` wraps text in: a user turn, an assistant turn, and
the end of a turn. A tokenizer needs them only for that format (any ids);
:func:`train_tokenizer` gives them the ids after :data:`SPECIAL_TOKENS`."""

TOKENIZER_TYPES: tuple[str, ...] = ("HuggingFaceTokenizer",)
"""The ``--tokenizer-type`` values real data can be read with."""

TOKENIZER_FILE = "tokenizer.json"
"""The file of a tokenizer directory that holds the tokenizer."""


@dataclass(frozen=True)
class TextTokenizer:
    """A loaded tokenizer with OrchWeave's special tokens."""

    directory: str
    """The directory it was loaded from."""

    backend: Any = field(repr=False, compare=False)
    """The ``tokenizers.Tokenizer``."""

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce, special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """The id of a special token."""
        return self.backend.token_to_id(token)

    def has_token(self, token: str) -> bool:
        """Whether the tokenizer defines ``token`` (a special token such as a chat turn's)."""
        return self.backend.token_to_id(token) is not None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, with no special tokens added."""
        return self.backend.encode(text, add_special_tokens=False).ids


def load_tokenizer(tokenizer_type: str | None, directory: str | None) -> TextTokenizer:
    """Load ``--tokenizer-model DIR`` as ``--tokenizer-type``.

    Raises:
        ConfigError: the type is not supported, the directory or its ``tokenizer.json`` does
            not exist or cannot be read, or its special tokens are not at OrchWeave's ids.
    """
    if tokenizer_type not in TOKENIZER_TYPES:
        raise ConfigError(
            f"--data-path needs --tokenizer-type {' or '.join(TOKENIZER_TYPES)}, got "
            f"{tokenizer_type}"
        )
    if not directory:
        raise ConfigError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model DIR")
    if not os.path.isdir(directory):
        raise ConfigError(f"--tokenizer-model {directory}: no such directory")
    path = os.path.join(directory, TOKENIZER_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"--tokenizer-model {directory}: has no {TOKENIZER_FILE}")
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise ConfigError(
            "--tokenizer-model needs the 'tokenizers' package: the 'data' extra"
        ) from e
    try:
        backend = Tokenizer.from_file(path)
    except Exception as e:  # the library raises a bare Exception on a malformed file
        raise ConfigError(f"--tokenizer-model {directory}: cannot read {path}: {e}") from e
    for want, token in enumerate(SPECIAL_TOKENS):
        got = backend.token_to_id(token)
        if got != want:
            raise ConfigError(
                f"--tokenizer-model {directory}: special token {token} has id {got}, OrchWeave "
                f"needs {want} (the order {', '.join(SPECIAL_TOKENS)} from id 0)"
            )
    return TextTokenizer(directory, backend)


def train_tokenizer(texts: Iterable[str], directory: str, vocab_size: int) -> TextTokenizer:
    """Train a small byte-level BPE tokenizer on ``texts`` and save it in ``directory``; its
    special tokens are :data:`SPECIAL_TOKENS` then :data:`CHAT_TOKENS`.

    Args:
        texts: the training corpus.
        directory: where ``tokenizer.json`` goes (created when missing).
        vocab_size: the most ids, special tokens and the 256 byte symbols included.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS + CHAT_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(texts), trainer=trainer)
    os.makedirs(directory, exist_ok=True)
    backend.save(os.path.join(directory, TOKENIZER_FILE))
    return TextTokenizer(directory, backend)
