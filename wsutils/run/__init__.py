"""Running the book's experiments (import from the module; nothing is re-exported here): the
knobs (``config``), seeds (``seeds``), grids on any executor (``sweep``), grid records as
arrays and tables (``records``), devices (``device``), progress bars (``progress``), numbers
for the prose (``glue``)."""
