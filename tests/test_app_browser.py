"""The explorer in a real browser (Debian chromium + playwright-python, UX.md §6.4): type a prompt, run
the comparison on the default model, wait for both outputs, scrub the step slider and see the tree
change, upload a shipped trace and see it replayed. Screenshots go to test-output/screenshots/.
Skipped where /usr/bin/chromium, playwright or the default model is missing."""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "test-output" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]
sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture(scope="module")
def url():
    from app.session.hub import ModelHub
    from app.session.settings import Caps
    from app.page.ui import build_demo, launch_kwargs
    from respec.models.loading import default_cache_dir

    if not (default_cache_dir() / "config.json").is_file():
        pytest.skip("the default model is not in the local cache (run scripts/setup.sh)")
    caps = Caps(max_new_tokens=64, default_new_tokens=24, max_tree_tokens=64, time_limit_s=400, queue_size=4)
    demo = build_demo(hub=ModelHub(), caps=caps)
    _, local, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                              **launch_kwargs())
    try:
        yield local
    finally:
        demo.close()


@pytest.fixture(scope="module")
def browser():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(url, browser):
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.goto(url)
    pg.errors = errors
    yield pg
    pg.close()


def tree_title(page) -> str:
    return page.locator("#tree-plot .gtitle").first.text_content(timeout=30_000) or ""


def test_page_opens_with_a_recorded_trace(page):
    expect(page.locator("#status")).to_contain_text("Replaying the recorded trace", timeout=60_000)
    expect(page.locator("#respec-output")).to_contain_text("Monday", timeout=30_000)
    expect(page.locator("#metrics")).to_contain_text("mean accepted length")


def test_run_compare_on_the_default_model(page):
    # The page's load event opens the recorded trace and puts its prompt into the box: wait for it,
    # so it cannot overwrite the prompt typed here (this test may run without the one above).
    expect(page.locator("#status")).to_contain_text("Replaying the recorded trace", timeout=60_000)
    page.locator("#prompt textarea").fill("List the planets of the solar system, then list them again.")
    page.locator("#run").click()
    expect(page.locator("#status")).to_contain_text("done", timeout=300_000)
    for elem in ("#respec-output", "#eagle-output"):
        text = page.locator(elem).inner_text()
        assert "Monday" not in text and len(text.strip()) > 20, f"{elem} shows the new run: {text!r}"
    expect(page.locator("#identical-badge")).to_contain_text("outputs")
    expect(page.locator("#metrics")).to_contain_text("tokens/s")
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)


def test_without_vanilla_the_chart_note_sits_in_the_waterfall_panel(page):
    """Compare without vanilla (the run above, or the recorded trace the page opens with): the note
    "tick 'also run vanilla' to measure it" is drawn inside the waterfall's panel, not over the
    acceptance-by-position panel, whose depth axis keeps the depths drawn (it was stretched to -2)."""
    page.get_by_role("tab", name="Compare").click()
    plot = page.locator("#anatomy-plot")
    note = plot.locator("g.annotation", has_text="also run vanilla")
    expect(note).to_be_visible(timeout=60_000)
    box = note.bounding_box()
    assert plot.locator(".draglayer .x2y2 rect.nsewdrag").count(), \
        "the waterfall's panel has axes (plotly.js drops axes no trace uses; the note fell back to the first panel)"
    waterfall = plot.locator(".draglayer .x2y2 rect.nsewdrag").first.bounding_box()
    depth = plot.locator(".draglayer .xy rect.nsewdrag").first.bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    assert (waterfall["x"] <= cx <= waterfall["x"] + waterfall["width"]
            and waterfall["y"] <= cy <= waterfall["y"] + waterfall["height"]), (box, waterfall)
    assert box["x"] >= depth["x"] + depth["width"], "the note stays out of the acceptance-by-position panel"
    ticks = plot.locator(".subplot.xy .xaxislayer-above .xtick text").all_text_contents()   # SVG: no innerText
    assert ticks and not any(t.strip().startswith(("-", "\u2212")) for t in ticks), f"depth ticks: {ticks}"


def test_why_a_draft_pays_acceptance_by_position_and_the_waterfall(page):
    """With vanilla in the run: the anatomy chart draws acceptance by draft position (one line per
    run) and the speedup's waterfall with data, the metrics table states the factors, and the step
    explorer says how the run on screen accepted by position."""
    page.locator("#include-vanilla label").click()
    page.locator("#prompt textarea").fill("Count from one to ten in words, then count again.")
    page.locator("#run").click()
    expect(page.locator("#status")).to_contain_text("done", timeout=300_000)
    plot = page.locator("#anatomy-plot")
    # the status may still say "done" from the run before (no waterfall: it had no vanilla), so the
    # waterfall itself is what tells this run finished; a slow CPU gets the same time as the run
    expect(plot.locator(".js-plotly-plot")).to_be_visible(timeout=300_000)
    expect(plot.locator("g.waterfalllayer g.trace").first).to_be_attached(timeout=300_000)
    assert plot.locator("g.waterfalllayer g.trace").count() >= 2, "one waterfall per method against vanilla"
    assert plot.locator("g.scatterlayer g.trace").count() >= 2, "acceptance-by-depth lines (and the cost curve)"
    expect(plot).to_contain_text("accepted by draft position")
    metrics = page.locator("#metrics")
    expect(metrics).to_contain_text("speedup anatomy")
    expect(metrics).to_contain_text("tokens/forward")
    expect(metrics).to_contain_text("accepted by draft depth")
    page.screenshot(path=str(SHOTS / "anatomy.png"), full_page=True)
    page.get_by_role("tab", name="Step explorer").click()
    expect(page.locator("#step-info")).to_contain_text("Accepted by draft position", timeout=30_000)
    page.get_by_role("tab", name="Compare").click()
    page.locator("#include-vanilla label").click()      # back as the other tests expect it


def test_the_left_column_runs_suffix_decoding(page):
    from respec.drafters.suffix import suffix_library
    if suffix_library()[0] is None:
        pytest.skip("arctic-inference is not built here")
    page.locator("#column-a input").click()
    page.get_by_role("option", name="SuffixDecoding").click()
    page.locator("#prompt textarea").fill("Say hello three times.")
    page.locator("#run").click()
    # The status still says "done" from the test before until this run's first update, which also
    # relabels the column: wait for that first, so the verdict does not depend on how fast a run is.
    expect(page.locator("#respec-header")).to_contain_text("SuffixDecoding", timeout=300_000)
    expect(page.locator("#status")).to_contain_text("done", timeout=300_000)
    expect(page.locator("#metrics")).to_contain_text("SuffixDecoding", timeout=300_000)
    page.locator("#column-a input").click()
    page.get_by_role("option", name="ReSpec", exact=True).click()      # back as the other tests expect it


def test_step_slider_changes_the_tree(page):
    page.get_by_role("tab", name="Step explorer").click()
    expect(page.locator("#tree-plot .js-plotly-plot")).to_be_visible(timeout=30_000)
    expect(page.locator("#tree-plot .gtitle")).to_contain_text("step 0", timeout=30_000)
    before = tree_title(page)
    slider = page.locator("#step-slider input[type=range]")
    slider.focus()
    for _ in range(3):
        slider.press("ArrowRight")
    expect(page.locator("#tree-plot .gtitle")).to_contain_text("step 3", timeout=30_000)
    assert tree_title(page) != before, "Moving the slider must redraw the tree for the new step."
    expect(page.locator("#step-info")).to_contain_text("Step 3")
    expect(page.locator("#entropy-plot .js-plotly-plot")).to_be_visible()
    page.locator("#teaching label").click()
    expect(page.locator("#narration")).to_contain_text("Step 3", timeout=30_000)
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "step-explorer.png"), full_page=True)


def test_uploaded_trace_is_replayed(page):
    page.get_by_role("tab", name="Trace files").click()
    files = [ROOT / "assets" / "traces" / f"eiffel-tower-rag__{k}.json" for k in ("respec", "eagle")]
    page.locator("#trace-upload input[type=file]").set_input_files([str(f) for f in files])
    expect(page.locator("#status")).to_contain_text("Replaying 2 uploaded", timeout=60_000)
    expect(page.locator("#trace-header")).to_be_visible()
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#respec-output")).to_contain_text("Tower", timeout=30_000)
    expect(page.locator("#eagle-output")).to_contain_text("Tower")
    page.get_by_role("tab", name="Step explorer").click()
    expect(page.locator("#step-info")).to_contain_text("Step 0 / 6", timeout=30_000)
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "replay.png"), full_page=True)


def test_clicking_the_entropy_plot_selects_a_step(page):
    point = page.locator("#entropy-plot .scatterlayer .trace .points path").nth(30)
    point.scroll_into_view_if_needed()       # the page above it grows (e.g. metrics rows): a click off-screen is lost
    box = point.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_timeout(300)
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(page.locator("#step-info")).not_to_contain_text("Step 0 /", timeout=30_000)


def test_run_twice_is_refused_and_stop_cancels(page):
    page.get_by_role("tab", name="Compare").click()
    page.locator("#prompt textarea").fill("Count from one to fifty in words.")
    page.locator("#run").click()
    expect(page.locator("#status")).to_contain_text("▶", timeout=60_000)
    page.locator("#run").click()
    expect(page.get_by_text("A run is already going in this tab").first).to_be_visible(timeout=30_000)
    page.locator("#stop").click()
    expect(page.locator("#status")).to_contain_text("stopped", timeout=30_000)


def test_empty_prompt_is_reported_in_the_page(page):
    page.get_by_role("tab", name="Compare").click()
    page.locator("#prompt textarea").fill("")
    page.locator("#run").click()
    expect(page.locator("#status")).to_contain_text("prompt is empty", timeout=30_000)
    assert not page.errors, f"no JavaScript errors: {page.errors}"


def test_the_lab_runs_a_tiny_benchmark_and_offers_the_csv(page, tmp_path):
    import json
    q = tmp_path / "questions.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Name the days of the week."]}) + "\n")
    page.get_by_role("tab", name="Lab").click()
    page.locator("#lab-upload input[type=file]").set_input_files(str(q))
    page.get_by_label("summarization").uncheck()
    for m in ("eagle2", "respec"):
        page.locator("#lab-methods").get_by_label(m, exact=True).uncheck()
    page.locator("#lab-max-new input[type=number]").fill("8")
    page.locator("#lab-max-new input[type=number]").press("Enter")
    page.locator("#lab-run").click()
    expect(page.locator("#lab-status")).to_contain_text("Lab done: 2 runs", timeout=180_000)
    table = page.locator("#lab-table").inner_text()
    assert "overall" in table and "sam" in table and "vanilla" in table, table
    assert "accept_at_depth_1" in table and "tokens_per_forward" in table, table
    expect(page.locator("#lab-plot g.waterfalllayer g.trace").first).to_be_attached(timeout=30_000)
    expect(page.locator("#lab-download")).to_be_visible()
    page.screenshot(path=str(SHOTS / "lab.png"), full_page=True)
    page.get_by_role("tab", name="Compare").click()


def _set_number(pg, elem_id: str, value) -> None:
    box = pg.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_run_history_pin_a_baseline_repeat_and_export(url, browser):
    """Tuning by hand (issue 20), in its own browser context: two runs with different θ_H make two
    history rows; pinning the first, a third run (repeat ×3) shows deltas against it with a median
    and a spread; the CSV holds the rows; restore puts θ_H back; the history survives a tab switch
    and a replay, and another browser context does not see it."""
    import re

    import pandas as pd
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.goto(url)
    expect(pg.locator("#status")).to_contain_text("Replaying the recorded trace", timeout=60_000)
    history = pg.locator("#run-history")
    pg.locator("#prompt textarea").fill("Name the days of the week.")
    pg.get_by_text("Settings — every threshold").click()
    _set_number(pg, "set-max-new-tokens", 8)
    for run, theta in ((1, 1.5), (2, 2.5)):
        _set_number(pg, "set-trigger-theta-entropy", theta)
        pg.locator("#run").click()
        expect(pg.locator("#status")).to_contain_text(f"run #{run} added to the history", timeout=300_000)
        expect(history).to_contain_text(f"θ_H={theta}")
    assert "θ_H=1.5" in history.inner_text() and "θ_H=2.5" in history.inner_text()

    pg.locator("#pin-run input").click()
    pg.get_by_role("option", name=re.compile(r"^#1 ·")).click()
    pg.locator("#pin-a").click()
    expect(pg.locator("#baseline-delta")).to_contain_text("vs A = run #1", timeout=30_000)

    _set_number(pg, "repeats", 3)
    pg.locator("#run").click()
    expect(pg.locator("#status")).to_contain_text("run #3 added to the history", timeout=300_000)
    delta = pg.locator("#baseline-delta")
    expect(delta).to_contain_text("Run #3")
    expect(delta).to_contain_text("vs A = run #1")
    expect(delta).to_contain_text("θ_H 1.5 → 2.5")
    text = delta.inner_text()
    assert re.search(r"median [\d.]+ tok/s, spread [\d.]+–[\d.]+", text), text
    assert re.search(r"(within|outside) the spread", text), text
    pg.screenshot(path=str(SHOTS / "run-history.png"), full_page=True)

    with pg.expect_download(timeout=30_000) as dl:
        pg.locator("#history-csv").click()
    df = pd.read_csv(dl.value.path())
    assert list(df["run"]) == [1, 2, 3] and list(df["repeats"]) == [1, 1, 3]
    assert list(df["settings ≠ defaults"].str.contains("θ_H=1.5")) == [True, False, False]
    assert df["ReSpec tok/s"].gt(0).all() and pd.notna(df["ReSpec tok/s spread"].iloc[2])

    pg.locator("#restore-a").click()
    expect(pg.locator("#set-trigger-theta-entropy input[type=number]")).to_have_value("1.5", timeout=30_000)

    pg.get_by_role("tab", name="Trace files").click()
    pg.locator("#open-trace").click()
    expect(pg.locator("#status")).to_contain_text("Replaying the recorded trace", timeout=60_000)
    pg.get_by_role("tab", name="Compare").click()
    expect(history).to_contain_text("θ_H=1.5")
    assert "θ_H=2.5" in history.inner_text(), "Switching tabs and replaying keep the history."

    other = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    other.goto(url)
    expect(other.locator("#status")).to_contain_text("Replaying the recorded trace", timeout=60_000)
    expect(other.locator("#baseline-delta")).to_contain_text("No runs yet")
    assert "θ_H" not in other.locator("#run-history").inner_text(), "Another browser session sees no rows."
    other.context.close()
    assert not errors, f"no JavaScript errors: {errors}"
    ctx.close()


def test_a_model_that_fails_to_load_leaves_a_banner_and_replay_mode(browser):
    """A second server whose model cannot load: Run reports it, the banner says replay mode, a
    reload keeps the banner, and the recorded traces still open."""
    from app.session.hub import ModelHub
    from app.session.settings import Caps
    from app.page.ui import build_demo, launch_kwargs

    def broken(spec):
        raise OSError(f"weights of {spec} are unreadable (simulated disk fault)")

    caps = Caps(max_new_tokens=64, default_new_tokens=24, max_tree_tokens=64, time_limit_s=60, queue_size=4)
    demo = build_demo(hub=ModelHub("default", factory=broken, choices=["default"]), caps=caps)
    _, local, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                              **launch_kwargs())
    try:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(local)
        expect(pg.locator("#respec-output")).to_contain_text("Monday", timeout=60_000)
        expect(pg.locator("#model-banner")).to_be_hidden()
        pg.locator("#prompt textarea").fill("Name three colors.")
        pg.locator("#run").click()
        expect(pg.locator("#status")).to_contain_text("Could not load the model", timeout=60_000)
        banner = pg.locator("#model-banner")
        expect(banner).to_contain_text("replay mode", timeout=10_000)
        expect(banner).to_contain_text("simulated disk fault")
        assert "Traceback" not in pg.locator("body").inner_text()
        pg.reload()
        expect(pg.locator("#model-banner")).to_contain_text("could not be loaded", timeout=60_000)
        expect(pg.locator("#respec-output")).to_contain_text("Monday", timeout=30_000)
        pg.screenshot(path=str(SHOTS / "model-failed-banner.png"), full_page=False)
        pg.close()
    finally:
        demo.close()


def test_the_1_5b_is_chosen_in_the_picker_and_compare_says_what_a_tree_costs(browser):
    """The second built-in model, once fetched (`python -m respec fetch qwen2.5-coder-1.5b`): the picker
    offers it, Compare runs on it with vanilla, and the metrics show the decode-only speedup and the
    sentence the verify-cost curve measured at load gives ("a 4-token tree costs 1.07 plain steps")."""
    from app.session.hub import ModelHub
    from app.session.settings import Caps
    from app.page.ui import build_demo, launch_kwargs
    from respec.runner import fetched_builtin_models

    if "qwen2.5-coder-1.5b" not in fetched_builtin_models():
        pytest.skip("Qwen2.5-Coder-1.5B is not in the local cache (python -m respec fetch qwen2.5-coder-1.5b)")
    caps = Caps(max_new_tokens=64, default_new_tokens=16, max_tree_tokens=64, time_limit_s=900, queue_size=4)
    demo = build_demo(hub=ModelHub("default"), caps=caps)
    _, local, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                              **launch_kwargs())
    try:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(local)
        expect(pg.locator("#status")).to_contain_text("Replaying the recorded trace", timeout=60_000)
        pg.locator("#model input").click()
        pg.get_by_role("option", name="qwen2.5-coder-1.5b", exact=False).click()
        pg.locator("#include-vanilla label").click()
        pg.locator("#prompt textarea").fill("Write a Python function that reverses a list, then explain it.")
        pg.locator("#run").click()
        expect(pg.locator("#status")).to_contain_text("done", timeout=900_000)
        metrics = pg.locator("#metrics")
        expect(metrics).to_contain_text("decode-only speedup")
        expect(metrics).to_contain_text("plain steps")
        assert "Monday" not in pg.locator("#respec-output").inner_text()
        pg.screenshot(path=str(SHOTS / "compare-1.5b.png"), full_page=True)
        pg.close()
    finally:
        demo.close()
