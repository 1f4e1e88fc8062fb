"""Real text: the IMDb reviews (data), BERT embeddings (embeddings), a model's own attention
(attention), the chat panel (chat)."""
