"""Record the README's Compare and Step-explorer screenshots from a real run of the app on the
default model (app defaults, "also run vanilla" ticked so the speedups are measured, not estimated).
Needs /usr/bin/chromium and playwright (the browser tests' setup). Run it on a quiet machine:

    .venv/bin/python scripts/readme_screenshots.py [--prompt TEXT] [--out docs/screenshots]
"""
from __future__ import annotations

import argparse
from pathlib import Path

PROMPT = "List the days of the week, one per line. Then list them again."


def main() -> None:
    ap = argparse.ArgumentParser(description="Record the README's screenshots from a real run of the app "
                                             "(needs playwright from requirements-dev.txt and /usr/bin/chromium)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--out", default="docs/screenshots")
    args = ap.parse_args()                   # before the test-only import: --help works with the runtime set
    from playwright.sync_api import expect, sync_playwright

    from app.events.handlers import ModelHub
    from app.session.settings import Caps
    from app.page.ui import build_demo, launch_kwargs
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    demo = build_demo(hub=ModelHub(), caps=Caps.from_env())
    _, local, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                              **launch_kwargs())
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                        args=["--no-sandbox", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(local)
            expect(page.locator("#status")).to_contain_text("Replaying", timeout=60_000)
            page.locator("#prompt textarea").fill(args.prompt)
            page.locator("#include-vanilla label").click()
            page.locator("#run").click()
            expect(page.locator("#status")).to_contain_text("done", timeout=600_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(out / "compare.png"), full_page=True)
            print("status:", page.locator("#status").inner_text())
            print(page.locator("#metrics").inner_text())
            page.get_by_role("tab", name="Step explorer").click()
            expect(page.locator("#tree-plot .gtitle")).to_contain_text("step 0", timeout=60_000)
            slider = page.locator("#step-slider input[type=range]")
            slider.focus()
            for _ in range(3):
                slider.press("ArrowRight")
            expect(page.locator("#tree-plot .gtitle")).to_contain_text("step 3", timeout=30_000)
            page.locator("#teaching label").click()
            expect(page.locator("#narration")).to_contain_text("Step 3", timeout=30_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(out / "step-explorer.png"), full_page=True)
            browser.close()
    finally:
        demo.close()
    print(f"wrote {out / 'compare.png'} and {out / 'step-explorer.png'}")


if __name__ == "__main__":
    main()
