"""The dashboard in a real browser (Debian's Chromium through Playwright) against `fusionwatch serve`
with seed's history: pages load without console errors, charts draw their traces, a chart point and an
alert lead to their commit, acknowledging changes an alert's state, and the upload forms create a
project and a model whose run's progress the commit page follows."""

from __future__ import annotations

import os
import re

import pytest

from tests.service.serving import api_get
from tests.web import seed
from tests.web.conftest import screenshot

pytestmark = pytest.mark.slow

MODEL = f"/projects/{seed.PROJECT}/models/bert.onnx"
RESNET = "tests/models/resnet_tiny_opset17.onnx"


def _rendered_traces(page, chart: str) -> int:
    """Traces Plotly drew into the chart's SVG (not only the data it was given)."""
    page.wait_for_selector(f"#{chart}[data-rendered]")
    return page.locator(f"#{chart} .scatterlayer .trace").count()


def test_every_page_loads_without_console_errors_in_local_time(page):
    for name, path in [
        ("overview", "/"),
        ("project", f"/projects/{seed.PROJECT}"),
        ("model", MODEL),
        ("commit", f"/projects/{seed.PROJECT}/commits/{seed.sha(seed.FUSION_DROP)}"),
        ("alerts", "/alerts?state=open"),
        ("upload", "/upload"),
    ]:
        reply = page.goto(path)
        assert reply.status == 200, path
        page.wait_for_load_state("networkidle")
        screenshot(page, name)
        stamps = page.locator("time[datetime]")
        if stamps.count():
            # Rendered as UTC by the server, shown in the viewer's zone (New York) by the script.
            first = stamps.first
            assert "UTC" not in first.inner_text(), path
            assert first.get_attribute("title").endswith("Z"), path
    # The fusion drop's commit is stamped 2026-11-05T12:00Z: 7:00 in New York (EST, UTC-5).
    page.goto(f"/projects/{seed.PROJECT}/commits/{seed.sha(seed.FUSION_DROP)}")
    assert page.locator(".commit-meta time").inner_text() == "Nov 5, 2026, 7:00 AM"


def test_model_history_charts_draw_bands_medians_alerts_and_fused_ops(page):
    page.goto(MODEL)
    page.wait_for_selector("#fusion-chart[data-rendered]")
    screenshot(page, "model-charts", full_page=False)  # the README's picture (docs/dashboard.png)
    # Four series (two engines × two levels): p90, p10 band and median each, and a trace of alert markers
    # per panel with alerts (unfused levels above, fused levels below, each on its own scale): the seed's
    # alerts are all at level extended.
    assert _rendered_traces(page, "timing-chart") == 4 * 3 + 1
    # By default the series whose fused ops changed: onnxruntime/extended, where BiasGelu dropped and came back.
    # Attention, BiasGelu, FusedGemm, Gelu (the unfused GELUs while BiasGelu was lost), SkipLayerNormalization
    assert _rendered_traces(page, "fusion-chart") == 5
    bias_gelu = page.evaluate(  # the real counts (each op's line is lifted a little so equal counts stay apart)
        "() => document.getElementById('fusion-chart').data.find(t => t.name === 'BiasGelu').customdata.map(c => c[3])"
    )
    assert bias_gelu[seed.FUSION_DROP - 1:seed.FUSION_DROP + 1] == [2, 0]
    assert bias_gelu[seed.FUSION_BACK] == 2
    page.locator(".series-choice a", has_text="fusionwatch/disabled").click()
    page.wait_for_url(re.compile(r"engine=fusionwatch&level=disabled"))
    assert _rendered_traces(page, "fusion-chart") == 0  # nothing fuses at level disabled
    page.locator(".series-choice a", has_text="onnxruntime/extended").click()
    page.wait_for_url(re.compile(r"engine=onnxruntime&level=extended"))
    assert _rendered_traces(page, "fusion-chart") == 5
    screenshot(page, "model-onnxruntime-extended")


def test_hovering_a_point_names_its_commit_and_clicking_opens_it(page):
    page.goto(MODEL)
    page.wait_for_selector("#timing-chart[data-rendered]")
    # Where Plotly drew the fusion-regression marker: in the alerts trace of the fused levels' panel.
    x, y, sha = page.evaluate("""() => {
        const el = document.getElementById('timing-chart');
        const alerts = el.data.find(t => t.name === 'alerts' && t.customdata.some(c => c[3].startsWith('fusion-regression')));
        const i = alerts.customdata.findIndex(c => c[3].startsWith('fusion-regression'));
        const xa = el._fullLayout.xaxis, box = el.getBoundingClientRect();
        const ya = alerts.yaxis === 'y2' ? el._fullLayout.yaxis2 : el._fullLayout.yaxis;
        return [box.left + xa._offset + xa.l2p(xa.d2l(alerts.x[i])), box.top + ya._offset + ya.l2p(alerts.y[i]),
                alerts.customdata[i][1]];
    }""")
    page.mouse.move(x, y)
    hover = page.locator("#timing-chart .hoverlayer .hovertext").first
    hover.wait_for()
    text = hover.text_content()
    assert sha in text and "fusion-regression, timing-regression" in text and "BiasGeluFusion stopped firing" in text
    page.mouse.click(x, y)
    page.wait_for_url(f"**/commits/{seed.sha(seed.FUSION_DROP)}")


def test_clicking_an_alert_opens_its_commit_with_the_reason(page):
    page.goto("/alerts?kind=fusion-regression")
    page.locator("tr.alert-row a.alert-link").first.click()
    page.wait_for_url(f"**/projects/{seed.PROJECT}/commits/{seed.sha(seed.FUSION_DROP)}")
    near_misses = page.locator(".near-misses").first.inner_text()
    assert "Why BiasGeluFusion stopped firing" in near_misses
    assert "custom op, a fusion barrier" in near_misses
    screenshot(page, "commit-from-alert")


def test_acknowledging_an_alert_changes_its_state(page, server):
    page.goto(f"/alerts?project={seed.PROJECT}&kind=timing-regression&state=confirmed")
    rows = page.locator("tr.alert-row")
    before = rows.count()
    assert before >= 1
    alert_id = rows.first.get_attribute("data-alert-id")
    rows.first.locator("button.ack").click()
    page.wait_for_load_state("networkidle")
    assert page.locator("tr.alert-row").count() == before - 1  # the filter keeps confirmed ones only
    state = api_get(f"{server}/api/v1/alerts", params={"kind": "timing-regression", "state": "acknowledged"}).json()
    assert int(alert_id) in [a["id"] for a in state["items"]]
    page.goto("/alerts?kind=timing-regression&state=acknowledged")
    assert page.locator(f"tr[data-alert-id='{alert_id}'] td.state").inner_text() == "acknowledged"


def test_upload_forms_create_a_project_and_a_model_whose_run_progress_is_followed(page, server):
    page.goto("/upload")
    form = page.locator("#create-project")
    form.locator("input[name=name]").fill("cnn-browser")
    for box in form.locator("input[name=engines]").all():
        box.set_checked(box.get_attribute("value") == "fusionwatch")
    for box in form.locator("input[name=levels]").all():
        box.set_checked(box.get_attribute("value") in ("disabled", "all"))
    form.locator("input[name=runs]").fill("3")
    form.locator("input[name=warmup]").fill("1")
    form.locator("button[type=submit]").click()
    page.wait_for_url("**/upload?project=cnn-browser")

    upload = page.locator("#upload-model")
    assert upload.locator("select[name=project]").input_value() == "cnn-browser"
    upload.locator("input[name=file]").set_input_files(RESNET)
    upload.locator("input[name=name]").fill("resnet.onnx")
    upload.locator("input[name=commit]").fill("feedbee1")
    upload.locator("input[name=message]").fill("first export")
    screenshot(page, "upload-filled")
    upload.locator("button[type=submit]").click()
    page.wait_for_url("**/projects/cnn-browser/commits/feedbee1")
    # The page follows the run (GET /api/v1/runs/{id}) and reloads when it ends, showing the results.
    page.wait_for_selector("td.verdict .badge-ok", timeout=180_000)
    assert page.locator(".progress-text").inner_text() == "2/2 done"
    assert page.locator("article.diff").count() == 2
    models = api_get(f"{server}/api/v1/projects/cnn-browser/models").json()
    assert [m["name"] for m in models["items"]] == ["resnet.onnx"]
    page.goto("/projects/cnn-browser")
    assert page.locator("table.cells tbody tr").count() == 2
    screenshot(page, "project-after-upload")


def test_signing_in_with_a_token_and_out_again(browser, server):
    """A browser with no cookie is sent to the sign-in page, comes back where it was going, and signing
    out ends the session; the token never reaches the page's scripts (HttpOnly)."""
    context = browser.new_context(base_url=server)
    page = context.new_page()
    try:
        page.goto("/alerts?state=open")
        assert page.url.endswith("/login?next=/alerts%3Fstate%3Dopen")
        page.fill("input[name=token]", "fw_" + "x" * 43)
        page.click("button[type=submit]")
        assert page.locator("p.error").inner_text() == "That token is unknown, revoked or mistyped."
        page.fill("input[name=token]", os.environ["FUSIONWATCH_TOKEN"])
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r"/alerts\?state=open$"))
        assert page.locator("header .signed-in span").inner_text() == "test-admin"
        assert page.evaluate("document.cookie") == ""
        screenshot(page, "signed-in", full_page=False)
        page.click("header .signed-in button")
        page.wait_for_url(re.compile(r"/login$"))
        page.goto("/")
        assert "/login?next=/" in page.url
    finally:
        context.close()
