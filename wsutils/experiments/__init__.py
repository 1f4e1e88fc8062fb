"""One module per chapter's grids: their grid-point functions (attention, normalisation, imdb)."""
