"""Real text (import from the module; nothing is re-exported here): the IMDb reviews
(``data``), a model's embeddings and its loading (``embeddings``), a real model's attention
between words (``word_attention``), the chat panel (``chat``)."""
