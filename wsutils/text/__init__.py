"""Real text (import from the module; nothing is re-exported here): the IMDb reviews
(``data``), a model's embeddings and its loading (``embeddings``), the rows a one-token
substitution puts into a text (``token_rows``), a real model's attention
between words (``word_attention``), the chat panel (``chat``)."""
