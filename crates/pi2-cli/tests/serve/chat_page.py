"""The built-in chat page in headless Chromium (Debian `chromium` and `chromium-driver`):
type a message, press Enter, see the answer stream in, greedy, equal to `pi2 run`'s. Run by crates/pi2-cli/tests/serve.rs
against a running `pi2 serve` (PI2_URL)."""

import os
import shutil
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

url = os.environ["PI2_URL"]
options = webdriver.ChromeOptions()
for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
    options.add_argument(flag)
options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
driver = webdriver.Chrome(service=Service(driver_path), options=options)
try:
    driver.get(url + "/")
    # Record every change of the answer's text as the page makes it.
    driver.execute_script(
        """window.updates = [];
        new MutationObserver(() => {
          const a = document.querySelectorAll('.msg.assistant');
          if (a.length) window.updates.push(a[a.length - 1].textContent);
        }).observe(document.getElementById('messages'),
                   {subtree: true, childList: true, characterData: true});"""
    )
    # Greedy and as long as `pi2 run -n 24` (PI2_EXPECTED), so the answers can be compared.
    for field, value in (("temperature", "0"), ("max-tokens", "24")):
        el = driver.find_element(By.ID, field)
        el.clear()
        el.send_keys(value)
    box = driver.find_element(By.ID, "input")
    box.send_keys(os.environ["PI2_QUESTION"])
    box.send_keys(Keys.ENTER)
    deadline = time.time() + 60
    while time.time() < deadline:
        if driver.find_element(By.ID, "send").is_enabled() and (
            driver.find_element(By.ID, "stats").text or driver.find_elements(By.CSS_SELECTOR, ".msg.error")
        ):
            break
        time.sleep(0.05)
    # More than one growing partial text means the answer streamed in.
    seen = []
    for text in driver.execute_script("return window.updates"):
        if text and (not seen or seen[-1] != text):
            seen.append(text)
    errors = driver.find_elements(By.CSS_SELECTOR, ".msg.error")
    assert not errors, errors[0].text
    final = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].text
    assert final.strip(), "no answer appeared"
    assert len(seen) >= 2, f"the answer did not stream in (saw {seen})"
    stats = driver.find_element(By.ID, "stats").text
    assert "tokens" in stats, f"no end of the answer within the deadline (stats: {stats!r})"
    shown = driver.execute_script(
        "const a = document.querySelectorAll('.msg.assistant'); return a[a.length - 1].textContent;"
    )
    assert shown == os.environ["PI2_EXPECTED"], (shown, os.environ["PI2_EXPECTED"])
    print(f"chat page: answer streamed in {len(seen)} steps: {final[:60]!r}; {stats}")
finally:
    driver.quit()
