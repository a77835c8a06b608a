"""The console driven in headless Chromium (Debian's ``chromium`` + ``chromium-driver``, Selenium from PyPI).

The API process's site (JSON API, console, metrics) runs with the engine's
loops against a real PostgreSQL and broker; a real browser signs in, creates a
schedule through the form and reads its live preview, pauses it and reads the
timeline; a second browser session shows that tenant B's token sees none of
tenant A's schedules. Skipped, saying why, where /usr/bin/chromium is absent
(``.ci/run`` installs it). With ``CHRONOQ_CONSOLE_SCREENSHOTS=DIR`` the main
pages are saved there as PNG (docs/console/ holds the committed ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from engine.control.operators import create_operator_token
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from tests.support.console_site import console_site

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="headless Chromium is not installed: apt-get install -y chromium chromium-driver (.ci/run does)",
)

SHOTS = os.environ.get("CHRONOQ_CONSOLE_SCREENSHOTS")
TIMEOUT = 20


@contextlib.contextmanager
def browser() -> Iterator[WebDriver]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: WebDriver, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


def sign_in(driver: WebDriver, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base + "/ui/")
    WebDriverWait(driver, TIMEOUT).until(ec.presence_of_element_located((By.ID, "token")))
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    WebDriverWait(driver, TIMEOUT).until(ec.presence_of_element_located((By.ID, "schedule-rows")))


def texts(driver: WebDriver, selector: str) -> list[str]:
    """The texts of the matching elements, read at once (live sections are replaced as they refresh)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent);", selector
    )


def verdicts(driver: WebDriver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#timeline tr.slot')).map(r => r.dataset.verdict);"
    )


def create_pause_and_read_the_timeline(base: str, token: str) -> dict[str, object]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    seen: dict[str, object] = {}
    with browser() as driver:
        wait = WebDriverWait(driver, TIMEOUT)
        sign_in(driver, base, token)
        driver.find_element(By.ID, "new-schedule").click()
        wait.until(ec.presence_of_element_located((By.ID, "create-form")))
        Select(driver.find_element(By.ID, "f-kind")).select_by_value("cron")
        driver.find_element(By.ID, "f-expression").send_keys("30 2 * * *")
        driver.find_element(By.ID, "f-time_zone").send_keys("America/New_York")
        # The live preview answers as the fields change: wait for the answer to the zone too (an answer to the
        # expression alone, in UTC, can arrive while the zone is still being typed).
        wait.until(
            lambda d: len(items := texts(d, "#preview-list li")) == 10 and all("T02:30:00-0" in line for line in items)
        )
        seen["preview"] = texts(driver, "#preview-list li")
        # Now the schedule the test pauses: every 2 seconds.
        Select(driver.find_element(By.ID, "f-kind")).select_by_value("rate")
        expression = driver.find_element(By.ID, "f-expression")
        expression.clear()
        expression.send_keys("2s")
        driver.find_element(By.ID, "f-time_zone").clear()
        wait.until(lambda d: (texts(d, "#preview-list li") or [""])[0].endswith("+00:00"))
        driver.find_element(By.ID, "f-target").send_keys("browser.made")
        payload = driver.find_element(By.ID, "f-payload")
        payload.clear()
        payload.send_keys('{"note": "<script>window.__owned = 1</script>"}')
        shot(driver, "new-schedule")
        driver.find_element(By.ID, "create").click()
        wait.until(ec.presence_of_element_located((By.ID, "schedule-id")))
        seen["schedule_id"] = driver.find_element(By.ID, "schedule-id").text
        seen["payload"] = driver.find_element(By.ID, "payload").text
        seen["owned"] = driver.execute_script("return window.__owned === undefined ? null : window.__owned")
        # The live timeline fills in as the engine fires (no reload: the page's script refreshes it).
        wait.until(lambda d: verdicts(d).count("SCHEDULED") >= 2)
        driver.find_element(By.ID, "action-pause").click()
        wait.until(ec.presence_of_element_located((By.ID, "action-resume")))
        seen["notice"] = driver.find_element(By.ID, "notice").text
        wait.until(lambda d: verdicts(d).count("PAUSED") >= 2)
        # One script call reads the whole table: the live section may be swapped between two calls.
        seen["timeline"] = driver.execute_script(
            "return Array.from(document.querySelectorAll('#timeline tr.slot'))"
            ".map(r => [r.dataset.verdict, r.querySelector('.explanation').textContent]);"
        )
        shot(driver, "schedule")
        driver.get(base + "/ui/schedules")
        wait.until(ec.presence_of_element_located((By.ID, "schedule-rows")))
        shot(driver, "schedules")
        driver.get(base + "/ui/health")
        wait.until(ec.presence_of_element_located((By.ID, "lag-p99")))
        seen["health"] = driver.find_element(By.ID, "due-backlog").text
        shot(driver, "health")
        driver.get(base + "/ui/dead-letters")
        wait.until(ec.presence_of_element_located((By.ID, "dead-letters")))
        shot(driver, "dead-letters")
    return seen


def listed_schedules(base: str, token: str) -> list[str | None]:
    from selenium.webdriver.common.by import By

    with browser() as driver:
        sign_in(driver, base, token)
        rows = [
            row.get_attribute("data-schedule-id")
            for row in driver.find_elements(By.CSS_SELECTOR, "#schedule-rows tr[data-schedule-id]")
        ]
        driver.get(base + "/ui/schedules?q=acme")
        rows += [
            row.get_attribute("data-schedule-id")
            for row in driver.find_elements(By.CSS_SELECTOR, "#schedule-rows tr[data-schedule-id]")
        ]
        return rows


async def test_a_browser_creates_previews_pauses_and_reads_the_timeline(engine_db, kafka_bootstrap):
    async with console_site(engine_db, kafka_bootstrap) as site:
        tenant = await create_tenant(site.pool, "acme")
        seen = await asyncio.to_thread(create_pause_and_read_the_timeline, site.url, tenant.api_token)
    preview: list[str] = seen["preview"]  # type: ignore[assignment]
    assert all("T02:30:00-0" in line for line in preview)  # 02:30 New York, -05:00 or -04:00
    assert seen["owned"] is None and "<script>window.__owned = 1</script>" in str(seen["payload"])
    assert "Paused" in str(seen["notice"])
    timeline: list[list[str]] = seen["timeline"]  # type: ignore[assignment]
    verdicts = [verdict for verdict, _ in timeline]
    assert "PAUSED" in verdicts
    explanations = " | ".join(text for _, text in timeline)
    assert "the schedule was paused (version 2)" in explanations
    assert "CANCELED by version 2 (pause" in explanations or "SCHEDULED" in verdicts


async def test_tenant_b_sees_none_of_tenant_as_schedules(engine_db, kafka_bootstrap):
    async with console_site(engine_db, kafka_bootstrap, materialize=False) as site:
        acme = await create_tenant(site.pool, "acme")
        globex = await create_tenant(site.pool, "globex")
        control = ControlPlane(site.pool)
        mine = {
            (
                await control.create_schedule(
                    "acme", {"kind": "cron", "expression": f"{m} 9 * * *", "target": "acme.billing"}
                )
            )["schedule_id"]
            for m in range(3)
        }
        theirs = (
            await control.create_schedule("globex", {"kind": "rate", "expression": "1h", "target": "globex.sync"})
        )["schedule_id"]
        seen_by_b = await asyncio.to_thread(listed_schedules, site.url, globex.api_token)
        seen_by_a = await asyncio.to_thread(listed_schedules, site.url, acme.api_token)
        operator = await create_operator_token(site.pool, "ops")
        seen_by_operator = await asyncio.to_thread(listed_schedules, site.url, operator.token)
    assert seen_by_b == [theirs]  # and the search for "acme" found nothing
    assert set(seen_by_a) == mine
    assert set(seen_by_operator) >= mine | {theirs}
