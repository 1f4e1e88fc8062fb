"""The book as a reader sees it: open every page of the table of contents in headless Chromium,
save a full-page screenshot of each, and fail on what a reader would see broken.

    python tools/browser_check.py [--html _build/html] [--toc _toc.yml] [--out _build/screenshots]

``_build/html`` is served on 127.0.0.1 (a free port) and each page is loaded in one headless
Chromium driven over the DevTools protocol (``--remote-debugging-pipe``: no extra package).
Once the page has loaded and MathJax has finished typesetting, the checks run in the page's
own DOM:

- **errors**: a cell output that is a traceback, an error or stderr, or any output text with
  ``Traceback (most recent call last)``; a docutils ``system-message``/``problematic`` node;
- **figures**: an ``<img>`` that did not load, has no size, or is blank (a single colour);
  a ``<figure>`` with no image in it;
- **math**: a Sphinx math node (``.math``) that MathJax did not turn into ``mjx-container``,
  a MathJax error (``mjx-merror``, e.g. an undefined macro), or text outside code that still
  looks like TeX (a ``\\command``, ``$$``);
- **cross-references**: ``??`` or ``[?]`` in the text, or an ``xref`` that is not a link;
- **shows box**: more than 6 bullets in a chapter's "What this chapter shows" box, or
  a bullet that wraps to a second line at the 1280-pixel-wide window;
- **tables** (every page): a cell whose text wraps in a column narrower than about 12
  characters of its font at the 1280-pixel window (a column one word wide). A cell's lines
  are its text's boxes grouped by vertical overlap, so a subscript, an accent or a fraction
  of inline math is not a second line;
- **the front door** (:data:`FIRST_VIEWPORT`): the intro's summary figure and the ledger's
  abstract table end within the first 1280 × 900 viewport;
- **navigation**: a caption or link of the left navigation that starts or ends outside the
  sidebar, or a sidebar that scrolls sideways (a clipped caption, "he paper");
- **console errors**: what the browser console shows as an error while the page loads and
  is checked: an uncaught exception (e.g. a script's ``SyntaxError``), ``console.error``, a
  resource that failed to load (:func:`console_errors`).

Exit status 1 and one line per problem if anything is found; screenshots are saved either way.
Chromium is found as ``$CHROMIUM`` or ``chromium``/``chromium-browser``/``google-chrome`` on the
PATH (Debian: ``apt-get install -y chromium``).
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]
WIDTH, HEIGHT, MAX_HEIGHT = 1280, 1000, 16000  # Chromium refuses a much taller capture
#: The first screen a reader sees (issue 62): what must end within it, by page (a CSS selector
#: of the page's article; the first element that matches).
VIEWPORT = 900
FIRST_VIEWPORT = {
    "intro": ("the summary figure", "img"),
    "ledger": ("the abstract's table", "table"),
}
#: The narrowest column a cell may wrap in, in characters of its font (every page).
MIN_WRAP_CHARS = 12

# Runs in the page once it has loaded and MathJax is done; returns a list of problems.
CHECKS_JS = r"""
(async () => {
  if (document.readyState !== 'complete')
    await new Promise(r => addEventListener('load', r, {once: true}));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  if (document.fonts) await document.fonts.ready;
  const problems = [];
  // the page's own content (sphinx-book-theme: article.bd-article), not the header buttons
  const main = document.querySelector('article') || document.querySelector('main') || document.body;
  const where = el => {
    const s = el.closest('section[id]');
    return s ? ` (in section #${s.id})` : '';
  };
  const short = t => t.replace(/\s+/g, ' ').trim().slice(0, 120);
  // errors
  for (const el of main.querySelectorAll(
      '.output.traceback, .output.error, .output.stderr, .system-message, .problematic'))
    problems.push(`error output: ${short(el.textContent)}${where(el)}`);
  for (const el of main.querySelectorAll('.cell_output, .output'))
    if (/Traceback \(most recent call last\)/.test(el.textContent))
      problems.push(`traceback in output: ${short(el.textContent)}${where(el)}`);
  // figures
  for (const img of main.querySelectorAll('img')) {
    const name = img.getAttribute('src') || '(no src)';
    if (!img.complete || img.naturalWidth === 0 || img.naturalHeight === 0) {
      problems.push(`figure did not load: ${name}${where(img)}`);
      continue;
    }
    const r = img.getBoundingClientRect();
    if (r.width < 20 || r.height < 20) {
      problems.push(`figure shown at ${Math.round(r.width)}x${Math.round(r.height)} px: ${name}${where(img)}`);
      continue;
    }
    try {
      const c = document.createElement('canvas');
      const w = c.width = Math.min(img.naturalWidth, 400), h = c.height = Math.min(img.naturalHeight, 400);
      const ctx = c.getContext('2d');
      ctx.drawImage(img, 0, 0, w, h);
      const px = ctx.getImageData(0, 0, w, h).data;
      let differ = 0;
      for (let i = 4; i < px.length; i += 4)
        if (Math.abs(px[i] - px[0]) + Math.abs(px[i+1] - px[1]) + Math.abs(px[i+2] - px[2]) + Math.abs(px[i+3] - px[3]) > 24) differ++;
      if (differ < 0.001 * w * h) problems.push(`figure is blank (one colour): ${name}${where(img)}`);
    } catch (e) { /* an SVG or cross-origin image: size checks only */ }
  }
  for (const fig of main.querySelectorAll('figure'))
    if (!fig.querySelector('img, svg, video, canvas, object, iframe'))
      problems.push(`figure without an image: ${short(fig.textContent)}${where(fig)}`);
  // math
  for (const el of main.querySelectorAll('.math'))
    if (!el.querySelector('mjx-container') && el.tagName !== 'MJX-CONTAINER')
      problems.push(`math not rendered: ${short(el.textContent)}${where(el)}`);
  for (const el of main.querySelectorAll('mjx-merror'))
    problems.push(`MathJax error: ${short(el.getAttribute('data-mjx-error') || el.textContent)}${where(el)}`);
  // text outside code, scripts and rendered math
  const skip = 'pre, code, script, style, mjx-container, .highlight, .cell_input, textarea, kbd, samp';
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const p = n.parentElement;
    if (!p || p.closest(skip)) continue;
    const t = n.textContent;
    if (/\\[A-Za-z]{2,}|\$\$|\\\(|\\\[/.test(t)) problems.push(`raw TeX: ${short(t)}${where(p)}`);
    if (/\?\?|\[\?\]/.test(t)) problems.push(`unresolved reference: ${short(t)}${where(p)}`);
  }
  // a reference Sphinx could not resolve stays an unlinked .xref; Python objects outside the
  // book (numpy, torch: no intersphinx offline) are unlinked on purpose
  for (const el of main.querySelectorAll('.xref:not(.py), .std-ref, .std-numref'))
    if (!el.closest('a')) problems.push(`unresolved reference: ${short(el.textContent)}${where(el)}`);
  // code that scrolls sideways hides its end (issue 53): every code cell and code block
  // fits its column (a cell's printed output is not code: it may scroll)
  for (const pre of main.querySelectorAll('div.cell_input pre, div[class*="highlight-"] pre'))
    if (!pre.closest('.cell_output') && pre.scrollWidth > pre.clientWidth + 1)
      problems.push(`code scrolls sideways (${pre.scrollWidth} > ${pre.clientWidth} px): ${short(pre.textContent)}${where(pre)}`);
  // the left navigation (issue 54: a reader saw "he paper"): every caption and link starts
  // inside the sidebar's box, and the sidebar does not scroll sideways
  const side = document.querySelector('.bd-sidebar-primary');
  if (side && side.getBoundingClientRect().width > 0) {
    const box = side.getBoundingClientRect();
    if (side.scrollWidth > side.clientWidth + 1)
      problems.push(`navigation scrolls sideways (${side.scrollWidth} > ${side.clientWidth} px)`);
    for (const el of side.querySelectorAll('nav.bd-links p.caption, nav.bd-links a')) {
      const r = el.getBoundingClientRect();
      if (r.width > 0 && (r.left < box.left - 0.5 || r.right > box.right + 0.5))
        problems.push(`navigation entry clipped (${Math.round(r.left)}–${Math.round(r.right)} px outside ${Math.round(box.left)}–${Math.round(box.right)} px): ${short(el.textContent)}`);
    }
  }
  // the "What this chapter shows" box: at most 6 bullets, each one line on the page
  for (const box of main.querySelectorAll('.admonition')) {
    const title = box.querySelector('.admonition-title');
    if (!title || title.textContent.trim() !== 'What this chapter shows') continue;
    const items = box.querySelectorAll(':scope > ul > li');
    if (items.length > 6) problems.push(`shows box: ${items.length} bullets (at most 6)`);
    for (const li of items) {
      // lines from the item's height: tall inline math (a hat, a root) makes a line taller,
      // not a second one
      const lh = parseFloat(getComputedStyle(li).lineHeight) || 24;
      const lines = Math.floor((li.getBoundingClientRect().height + 0.45 * lh) / lh);
      if (lines > 1) problems.push(`shows box: a bullet on ${lines} lines: ${short(li.textContent)}`);
    }
  }
  return problems;
})()
"""

# Tables whose cells wrap in a column narrower than MIN_WRAP_CHARS characters (issue 62)
TABLES_JS = r"""
(() => {
  const MIN_WRAP_CHARS = %MIN_WRAP_CHARS%;
  const problems = [];
  const main = document.querySelector('article') || document.querySelector('main') || document.body;
  const where = el => {
    const s = el.closest('section[id]');
    return s ? ` (in section #${s.id})` : '';
  };
  const short = t => t.replace(/\s+/g, ' ').trim().slice(0, 120);
  // a cell's lines from its text's own boxes
  const canvas = document.createElement('canvas').getContext('2d');
  for (const cell of main.querySelectorAll('table td, table th')) {
    const cs = getComputedStyle(cell);
    canvas.font = cs.font;
    const chars = canvas.measureText('abcdefghijklmnopqrstuvwxyz').width / 26;
    const width = cell.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    if (width >= MIN_WRAP_CHARS * chars) continue;
    const range = document.createRange();
    range.selectNodeContents(cell);
    const lh = parseFloat(cs.lineHeight) || 1.3 * parseFloat(cs.fontSize);
    // lines: the boxes grouped by vertical overlap (a box that starts at or below the bottom
    // of the line so far, within a tenth of a line, starts a new one); a raised or lowered
    // box (a sub- or superscript, an accent) overlaps its line
    const boxes = [...range.getClientRects()].filter(r => r.width > 0 && r.height > 0);
    boxes.sort((a, b) => a.top - b.top);
    let lines = 0, bottom = -Infinity;
    for (const b of boxes) {
      if (b.top >= bottom - 0.1 * lh) { lines += 1; bottom = b.bottom; }
      else bottom = Math.max(bottom, b.bottom);
    }
    if (lines >= 2)
      problems.push(`table: a cell wraps in a column ${Math.round(width / chars)} characters wide: ${short(cell.textContent)}${where(cell)}`);
  }
  return problems;
})()
""".replace("%MIN_WRAP_CHARS%", str(MIN_WRAP_CHARS))

# The bottom of the first element of the page's article that matches a selector, in page
# pixels (null where none matches).
BOTTOM_JS = r"""
(() => {
  const main = document.querySelector('article') || document.querySelector('main') || document.body;
  const el = main.querySelector(%s);
  return el ? el.getBoundingClientRect().bottom + window.scrollY : null;
})()
"""


def first_viewport(page: str, bottom: float | None) -> list[str]:
    """The front-door rule (:data:`FIRST_VIEWPORT`) for ``page``, given the bottom of its
    element (``None``: no such element)."""
    if page not in FIRST_VIEWPORT:
        return []
    what = FIRST_VIEWPORT[page][0]
    if bottom is None:
        return [f"first screen: {what} is missing"]
    if bottom > VIEWPORT:
        return [
            f"first screen: {what} ends at {round(bottom)} px, below the {WIDTH} × {VIEWPORT} viewport"
        ]
    return []


@dataclass
class PageReport:
    page: str
    screenshot: Path | None
    problems: list[str] = field(default_factory=list)
    js_errors: list[str] = field(default_factory=list)


def find_chromium() -> str | None:
    """The Chromium executable: ``$CHROMIUM`` or the first known name on the PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env) or (env if Path(env).is_file() else None)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def toc_pages(toc: Path) -> list[str]:
    """Every page of a jupyter-book ``_toc.yml`` (root first), as paths without suffix."""
    data = yaml.safe_load(toc.read_text())
    pages = [data["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                pages.append(e["file"])
            for key in ("chapters", "sections", "parts"):
                walk(e.get(key))

    for key in ("chapters", "parts", "sections"):
        walk(data.get(key))
    return [str(Path(p).with_suffix("")) for p in pages]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no access log on stderr
        pass


class Server:
    """``folder`` served on 127.0.0.1 at a free port, in a thread."""

    def __init__(self, folder: Path):
        handler = functools.partial(_Quiet, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class Browser:
    """One headless Chromium, driven over the DevTools protocol through a pipe
    (fd 3: commands to Chromium, fd 4: replies and events, NUL-separated JSON)."""

    def __init__(self, chromium: str, timeout: float = 90.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="wsbook-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # move the child's ends above fd 10 so that dup2 onto 3 and 4 cannot clobber them
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 11)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 11)
        os.close(to_child_r)
        os.close(from_child_w)

        def child():
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self.profile}",
                f"--window-size={WIDTH},{HEIGHT}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child,
            close_fds=False,  # Python fds are close-on-exec anyway
        )
        os.close(hi_r)
        os.close(hi_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def close(self):
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited (status {self.proc.poll()})")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, session: str | None = None, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def check_page(
        self, url: str, screenshot: Path | None, page: str = ""
    ) -> tuple[list[str], list[str]]:
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        try:
            self.send("Runtime.enable", session)
            self.send("Log.enable", session)
            self.send("Page.enable", session)
            self.send(
                "Emulation.setDeviceMetricsOverride",
                session,
                width=WIDTH,
                height=HEIGHT,
                deviceScaleFactor=1,
                mobile=False,
            )
            self.events.clear()
            nav = self.send("Page.navigate", session, url=url)
            if nav.get("errorText"):
                return [f"page did not load: {nav['errorText']}"], []
            res = self.send(
                "Runtime.evaluate",
                session,
                expression=CHECKS_JS,
                awaitPromise=True,
                returnByValue=True,
            )
            if "exceptionDetails" in res:
                return [f"the checks failed in the page: {res['exceptionDetails']}"], []
            problems = list(res["result"]["value"])
            tables = self.send(
                "Runtime.evaluate", session, expression=TABLES_JS, returnByValue=True
            )
            problems += list(tables["result"]["value"])
            if page in FIRST_VIEWPORT:
                selector = json.dumps(FIRST_VIEWPORT[page][1])
                at = self.send(
                    "Runtime.evaluate",
                    session,
                    expression=BOTTOM_JS % selector,
                    returnByValue=True,
                )
                problems += first_viewport(page, at["result"].get("value"))
            if screenshot is not None:
                metrics = self.send("Page.getLayoutMetrics", session)
                size = metrics.get("cssContentSize") or metrics["contentSize"]
                height = int(min(max(size["height"], HEIGHT), MAX_HEIGHT))
                self.send(
                    "Emulation.setDeviceMetricsOverride",
                    session,
                    width=WIDTH,
                    height=height,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                time.sleep(0.3)  # let the page lay out at its full height
                shot = self.send(  # the page's top MAX_HEIGHT pixels: a longer one is refused
                    "Page.captureScreenshot",
                    session,
                    format="png",
                    captureBeyondViewport=True,
                    clip=dict(x=0, y=0, width=WIDTH, height=height, scale=1),
                )
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            js_errors = console_errors(self.events)
            return problems + [f"console error: {e}" for e in js_errors], js_errors
        finally:
            self.send("Target.closeTarget", targetId=target)


def console_errors(events: list[dict]) -> list[str]:
    """The errors a reader's browser console shows, from the DevTools events of one page: an
    uncaught exception (``Runtime.exceptionThrown``, e.g. a ``SyntaxError`` of a script), a
    ``console.error``/``console.assert`` call, and a browser log entry of level ``error`` (a
    resource that failed to load, a blocked request). One line each."""
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            text = d.get("exception", {}).get("description") or d.get("text", "")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            text = " ".join(
                str(a.get("value", a.get("description", ""))) for a in p.get("args", [])
            )
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            if entry.get("url", "").split("?")[0].endswith("/favicon.ico"):
                continue  # the browser's own request, not one the page makes
            text = entry.get("text", "") + (f" ({entry['url']})" if entry.get("url") else "")
        else:
            continue
        out.append((text.splitlines() or [""])[0][:300])
    return out


def check_site(html: Path, pages: list[str], out: Path | None, chromium: str) -> list[PageReport]:
    """Open ``pages`` (paths relative to ``html``, without ``.html``) and check each."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    reports = []
    with Server(html) as server:
        browser = Browser(chromium)
        try:
            for page in pages:
                file = html / f"{page}.html"
                shot = out / f"{page.replace('/', '__')}.png" if out is not None else None
                if not file.is_file():
                    reports.append(PageReport(page, None, [f"{file} does not exist"]))
                    continue
                problems, js_errors = browser.check_page(f"{server.url}/{page}.html", shot, page)
                reports.append(PageReport(page, shot, problems, js_errors))
        finally:
            browser.close()
    return reports


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--html", type=Path, default=Path("_build/html"))
    ap.add_argument("--toc", type=Path, default=Path("_toc.yml"))
    ap.add_argument("--out", type=Path, default=Path("_build/screenshots"))
    ap.add_argument("pages", nargs="*", help="pages to check (default: every page of the toc)")
    args = ap.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print(
            "browser check: no Chromium found; install it (apt-get install -y chromium) "
            "or set CHROMIUM to its path.",
            file=sys.stderr,
        )
        return 2
    if not (args.html / "index.html").is_file() and not args.pages:
        print(
            f"browser check: {args.html} holds no built book; run `make book` first.",
            file=sys.stderr,
        )
        return 2
    pages = args.pages or toc_pages(args.toc)
    reports = check_site(args.html, pages, args.out, chromium)
    bad = 0
    for r in reports:
        status = "ok" if not r.problems else f"{len(r.problems)} problem(s)"
        print(f"{r.page}: {status}" + (f"  [{r.screenshot}]" if r.screenshot else ""))
        for p in r.problems:
            print(f"  - {p}")
        bad += bool(r.problems)
    print(f"browser check: {len(reports) - bad} of {len(reports)} pages clean")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
