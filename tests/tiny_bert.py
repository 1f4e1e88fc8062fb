"""The tiny random BERT the text tests build and save through the real transformers path: a
2-layer model (hidden 32, 4 heads of width 8) with a small WordPiece vocabulary. Shared by
tests/test_text.py and tests/test_trained.py."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

WORDS = (
    "i love her much smile the movie was good bad film great awful plot actor "
    "and it a of to is this not very positive negative review"
).split()


def save_tiny_bert(path: Path, *, edit: Callable | None = None, **config) -> Path:
    """Write the vocabulary, tokenizer and a random ``BertModel`` into ``path`` and return it.
    ``config`` overrides ``BertConfig`` fields; ``edit(model)`` may change the weights before
    they are saved. The caller seeds torch."""
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ing", "."]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = transformers.BertTokenizerFast.from_pretrained(str(path))
    cfg = transformers.BertConfig(
        **{
            **dict(
                vocab_size=len(vocab),
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
            ),
            **config,
        }
    )
    model = transformers.BertModel(cfg)
    if edit is not None:
        edit(model)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def tiny_roberta(bert):
    """A random 1-layer ``RobertaModel`` of the tiny BERT's width with its tokenizer, as an
    ``Encoder``: RoBERTa's embedding module numbers positions from ``padding_idx + 1``, which
    the functions that build rows from token ids must refuse (``check_positions``)."""
    import transformers

    from wsutils.text import embeddings as em

    cfg = transformers.RobertaConfig(
        vocab_size=bert.model.config.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return em.Encoder(
        name="roberta",
        identity="roberta",
        tokenizer=bert.tokenizer,
        model=transformers.RobertaModel(cfg).eval(),
    )
