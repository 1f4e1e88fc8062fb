"""Running the book's experiments: the knobs (config), seeds, grids on any executor (sweep),
devices, progress bars, numbers for the prose (glue)."""
