"""A Sphinx extension (loaded by ``_config.yml``, ``sphinx: local_extensions:``) that includes
each inline script once: the backport of sphinx-doc/sphinx#13402 for Sphinx < 8.2.2.

Why. ``Sphinx.add_js_file(None, body=...)`` called after the HTML builder is made (as
sphinx-thebe does for ``const THEBE_JS_URL = ...`` in ``env-before-read-docs``, and
sphinx-togglebutton for ``var togglebuttonSelector``) adds the script to the registry and to
the builder with the filename ``None``; ``StandaloneHTMLBuilder.prepare_writing`` then adds
the registry's scripts again as ``filename or ''``, and since ``None != ''`` the two are not
recognised as one: every page carries the script twice, and the second ``const`` is a
``SyntaxError: Identifier 'THEBE_JS_URL' has already been declared`` in the browser console.
The builder's ``add_js_file`` is wrapped to turn ``None`` into ``''`` as Sphinx 8.2.2 does,
so both additions are the same asset and the builder's own de-duplication keeps one.
"""

from __future__ import annotations

import sphinx
from sphinx.builders.html import StandaloneHTMLBuilder

#: The first Sphinx release with the fix (sphinx-doc/sphinx#13402).
FIXED_IN = (8, 2, 2)


def _none_as_empty(add_js_file):
    def wrapped(self, filename, *args, **kwargs):
        return add_js_file(self, "" if filename is None else filename, *args, **kwargs)

    wrapped.wsbook_none_as_empty = True
    return wrapped


def setup(app):
    original = StandaloneHTMLBuilder.add_js_file
    if sphinx.version_info[:3] < FIXED_IN and not getattr(original, "wsbook_none_as_empty", False):
        StandaloneHTMLBuilder.add_js_file = _none_as_empty(original)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
