"""The HTML report opened in real headless Chromium over the DevTools protocol, at the demo's
size and a fleet's: the page loads from the file alone (no network), draws every plot, logs no
error, and a full-page screenshot (kept as an artefact, see ``artefacts_dir``) is not blank."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testkit.polling import async_wait_until
from tests.reports.util import artefacts_dir

pytestmark = [pytest.mark.browser, pytest.mark.spark]

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
]
WIDTH = 1300


class Cdp:
    """A minimal DevTools client: one websocket to the browser, flat sessions."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        await self.ws.send_str(json.dumps(msg))
        res = await asyncio.wait_for(fut, 60)
        assert "error" not in res, (method, res)
        return dict(res["result"])

    async def wait_event(self, method: str, limit_s: float = 60) -> dict[str, Any]:
        async def seen() -> dict[str, Any] | None:
            return next((e for e in self.events if e.get("method") == method), None)

        return await async_wait_until(f"the browser event {method}", seen, limit_s)


async def wait_for_port(profile: Path, proc: asyncio.subprocess.Process) -> tuple[int, str]:
    f = profile / "DevToolsActivePort"

    async def port() -> tuple[int, str] | None:
        if proc.returncode is not None:
            raise AssertionError(f"chromium exited with {proc.returncode}")
        lines = f.read_text().splitlines() if f.exists() else []
        return (int(lines[0]), lines[1]) if len(lines) >= 2 else None

    return await async_wait_until("chromium's DevTools port", port, 60)


async def screenshot(report: Path, profile: Path) -> tuple[dict[str, Any], bytes, list[dict[str, Any]]]:
    """Open ``report`` in headless Chromium: what the page holds, a full-page PNG, and the
    browser's events (errors, requests)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs Debian's chromium (scripts/install-system.sh install)")
    proc = await asyncio.create_subprocess_exec(
        chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        port, path = await wait_for_port(profile, proc)
        async with aiohttp.ClientSession() as http, http.ws_connect(
            f"ws://127.0.0.1:{port}{path}", max_msg_size=0
        ) as ws:
            cdp = Cdp(ws)
            target = await cdp.call("Target.createTarget", url="about:blank")
            attached = await cdp.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
            sid = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                await cdp.call(f"{domain}.enable", sid)
            await cdp.call("Emulation.setDeviceMetricsOverride", sid, width=WIDTH, height=1000,
                           deviceScaleFactor=1, mobile=False)
            cdp.events.clear()
            await cdp.call("Page.navigate", sid, url=report.as_uri())
            await cdp.wait_event("Page.loadEventFired")
            probe = """JSON.stringify({
              plots: [...document.querySelectorAll('figure.plot')].map(f => ({
                name: f.dataset.plot, svg: !!f.querySelector('svg'),
                w: f.getBoundingClientRect().width, h: f.getBoundingClientRect().height,
                shapes: f.querySelectorAll('path, rect, use').length})),
              summary: document.querySelector('#summary').innerText,
              headline: document.querySelector('#headline').innerText,
              title: document.title, height: document.body.scrollHeight})"""
            res = await cdp.call("Runtime.evaluate", sid, expression=probe, returnByValue=True)
            page = json.loads(res["result"]["value"])
            height = min(int(page["height"]), 16_000)
            shot = await cdp.call("Page.captureScreenshot", sid, format="png", captureBeyondViewport=True,
                                  clip={"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1})
            await cdp.call("Browser.close")
            cdp.reader.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    return page, base64.b64decode(shot["data"]), cdp.events


def check_in_browser(
    page: dict[str, Any], png: bytes, events: list[dict[str, Any]], plots: list[str]
) -> None:
    assert page["title"] == "KRaftKeeper recovery report"
    assert [p["name"] for p in page["plots"]] == plots
    for p in page["plots"]:
        assert p["svg"] and p["w"] > 300 and p["h"] > 150 and p["shapes"] > 10, p
    assert "recover" in page["summary"] and "slowest took" in page["summary"]
    assert "completed" in page["headline"] and "failed" in page["headline"]
    errors = [
        e for e in events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    assert errors == []
    urls = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    assert urls and all(u.startswith(("file:", "data:")) for u in urls), urls  # self-contained
    # The screenshot is a real picture of the whole page: light background, a good share of ink.
    import matplotlib.image

    img = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert img.shape[1] == WIDTH and img.shape[0] == min(int(page["height"]), 16_000)
    rgb = img[..., :3]
    ink = (rgb.mean(axis=2) < 0.85).mean()
    assert 0.03 < ink < 0.9 and rgb.std() > 0.1


@pytest.fixture(scope="module")
def kafka_demo_report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Kafka demo's size and shape: one cluster, three RemoveThenAdd recoveries by
    ``operator watch`` and three by Kafka's auto-join (5 committed steps, recorded from outside)."""
    from tests.reports.test_orders import AUTO, AUTO_STEPS, KAFKA_RTA, RTA_STEPS, write_events
    from tests.reports.util import run_job

    recs = [
        ("w1", KAFKA_RTA, RTA_STEPS, [0, 8, 10, 180, 205, 1315, 1316]),
        ("w2", KAFKA_RTA, RTA_STEPS, [0, 10, 27, 99, 168, 1360, 1370]),
        ("w3", KAFKA_RTA, RTA_STEPS, [0, 76, 82, 127, 138, 200, 202]),
        ("a1", AUTO, AUTO_STEPS, [0, 169, 2087, 4592, 4592]),
        ("a2", AUTO, AUTO_STEPS, [0, 225, 2100, 4500, 4510]),
        ("a3", AUTO, AUTO_STEPS, [0, 438, 1900, 4400, 4400]),
    ]
    src = write_events(tmp_path_factory.mktemp("kafka-demo-events"), recs)
    return run_job(src, tmp_path_factory.mktemp("kafka-demo-report"))


@pytest.mark.parametrize(
    ("which", "plots"),
    [
        ("demo_report", ["each", "gantt"]),
        ("kafka_demo_report", ["each", "compare", "gantt"]),
        ("fleet_report", ["distributions", "compare", "gantt", "clusters", "daily", "bad-input"]),
    ],
)
async def test_report_renders_in_chromium(
    which: str, plots: list[str], request: pytest.FixtureRequest, tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out: Path = request.getfixturevalue(which)
    page, png, events = await screenshot((out / "report.html").resolve(), tmp_path / "profile")
    keep = artefacts_dir(tmp_path_factory) / f"{which}.png"
    keep.write_bytes(png)
    print(f"screenshot of {out / 'report.html'}: {keep}")
    check_in_browser(page, png, events, plots)
    if which == "kafka_demo_report":  # Kafka's order: the sentence says what removing first costs
        assert "voter set one short until AddVoter commits" in page["summary"], page["summary"]
        assert "one failure less tolerated" in page["headline"], page["headline"]
