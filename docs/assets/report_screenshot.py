"""Make docs/assets/report.png: the top of the report of a small offline run, as a browser shows it.

    .venv/bin/python docs/assets/report_screenshot.py [OUT.png]

Runs three stub models under two prompts on the refund task after a lost reply (offline, a few
seconds), then opens its report.html in headless Chromium (Debian's /usr/bin/chromium, as the
report's browser tests use) at 1440 px and saves the first screen. Rerun it when the report's
look changes, and commit the PNG.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
RUN = [
    "run",
    *("--model", "stub/retry", "--model", "stub/verify", "--model", "stub/noisy"),
    *("--prompt", "baseline", "--prompt", "cautious"),
    *("--task", "refund", "--fault", "lost_reply", "--protection", "bare"),
    *("--limit", "12", "--display", "none"),
]


def main(out: Path) -> None:
    twice = Path(sys.executable).with_name("twice")
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "logs"
        subprocess.run([str(twice), *RUN, "--log-dir", str(log_dir)], check=True, cwd=ROOT)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                page.goto((log_dir / "report.html").as_uri())
                page.screenshot(path=str(out))
            finally:
                browser.close()
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("report.png"))
