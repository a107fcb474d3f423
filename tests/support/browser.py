"""Headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by selenium, for
the tests of the interactive HTML views.

The driver path is given explicitly, so selenium-manager never tries to download anything.
When the browser is missing the tests FAIL (CI must have it: ``bash scripts/dev test``
installs it); set ``MI_SKIP_BROWSER=1`` to skip them on a machine without it.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("MI_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MI_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--disable-extensions", "--window-size=1400,1000"]


def _missing() -> str | None:
    for p in (CHROMIUM, CHROMEDRIVER):
        if not Path(p).exists():
            return f"{p} not found (apt-get install chromium chromium-driver, or bash scripts/dev test)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install -r requirements-test.txt)"
    return None


# Scroll every scrolling ancestor, then the window, so that point (x, y) of an element is in
# the middle of the viewport; return its viewport coordinates.
_SCROLL_TO_POINT = """
const [el, x, y] = arguments;
const at = () => { const r = el.getBoundingClientRect(); return [r.left + x, r.top + y]; };
for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
  if (a.scrollWidth > a.clientWidth || a.scrollHeight > a.clientHeight) {
    const b = a.getBoundingClientRect(), [px, py] = at();
    a.scrollLeft += px - (b.left + a.clientWidth / 2);
    a.scrollTop += py - (b.top + a.clientHeight / 2);
  }
}
let [px, py] = at();
window.scrollBy(px - innerWidth / 2, py - innerHeight / 2);
return at();
"""


class Browser:
    """One headless Chromium session; `open(path)` loads a page and waits until it rendered.
    The viewport is exactly `viewport` CSS pixels (device scale 1), so a screenshot is that
    size: 1400 x 900 for the screenshots in docs/img."""

    def __init__(self, viewport: tuple[int, int] = (1400, 900)) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="mi-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for f in FLAGS:
            opts.add_argument(f)
        opts.add_argument(f"--user-data-dir={self.profile}")
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
        self.viewport = viewport
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": viewport[0], "height": viewport[1], "deviceScaleFactor": 1,
            "mobile": False})

    def open(self, path: str | Path, timeout: float = 10.0) -> float:
        """Load `path` (file://); return the page's own render time in ms."""
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver.get(Path(path).resolve().as_uri())
        WebDriverWait(self.driver, timeout).until(
            lambda d: d.execute_script("return document.body && document.body.dataset.ready === '1'"))
        return float(self.driver.execute_script("return window.MI_RENDER_MS"))

    def console_errors(self) -> list[dict[str, Any]]:
        """Console messages at level SEVERE since the last call (JS errors included)."""
        return [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def hover(self, element: Any, x: float | None = None, y: float | None = None) -> None:
        """Move the real pointer over `element` (its centre), or to (x, y) pixels from its
        top-left corner, after scrolling that point into view (large canvases scroll)."""
        from selenium.webdriver.common.action_chains import ActionChains

        if x is None:
            self.js("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", element)
            ActionChains(self.driver).move_to_element(element).perform()
            return
        vx, vy = self.js(_SCROLL_TO_POINT, element, x, y)
        chain = ActionChains(self.driver)
        chain.w3c_actions.pointer_action.move_to_location(int(vx), int(vy))
        chain.perform()

    def click(self, element: Any, x: float | None = None, y: float | None = None) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        self.hover(element, x, y)
        ActionChains(self.driver).click().perform()

    def in_viewport(self, element: Any) -> bool:
        """Whether `element` is displayed and lies entirely inside the viewport, as it is
        now (without scrolling)."""
        r = self.js("const r = arguments[0].getBoundingClientRect(); "
                    "return [r.left, r.top, r.right, r.bottom, r.width, r.height]", element)
        w, h = self.js("return [innerWidth, innerHeight]")
        return (element.is_displayed() and r[4] > 0 and r[5] > 0 and r[0] >= 0 and r[1] >= 0
                and r[2] <= w and r[3] <= h)

    def screenshot_stats(self, path: str | Path | None = None,
                         colours: int | None = None) -> tuple[float, int]:
        """(pixel standard deviation over all channels, number of distinct colours) of a
        screenshot; saved to `path` when given (as a palette PNG of `colours` colours when
        given: small enough to commit). A blank page has std 0 and one colour."""
        import numpy as np
        from PIL import Image

        png = base64.b64decode(self.driver.get_screenshot_as_base64())
        if path is not None:
            if colours:
                img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colours)
                img.save(path, optimize=True)
            else:
                Path(path).write_bytes(png)
        img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32)
        colours = len(np.unique(img.reshape(-1, 3).astype(np.uint8), axis=0))
        return float(img.std()), colours

    def close(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)


def browser_or_fail() -> Browser:
    """A Browser, or pytest.skip when MI_SKIP_BROWSER=1, or pytest.fail when it is missing."""
    if os.environ.get("MI_SKIP_BROWSER") == "1":
        pytest.skip("MI_SKIP_BROWSER=1: browser tests skipped")
    why = _missing()
    if why:
        pytest.fail(f"the browser tests need headless Chromium: {why}. "
                    f"Set MI_SKIP_BROWSER=1 to skip them locally.")
    return Browser()
