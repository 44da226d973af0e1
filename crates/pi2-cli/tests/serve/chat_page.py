"""The built-in chat page in headless Chromium (Debian `chromium` and `chromium-driver`):
type a message, press Enter, see the answer stream in, greedy, equal to `pi2 run`'s; Markdown
rendered from DOM nodes only (a `<script>` in a reply is shown, never run), with lists, tables,
headings and a copy button on code; the Stop button; the
system prompt sent; the conversation kept across a reload. Run by crates/pi2-cli/tests/serve.rs
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
        "const a = document.querySelectorAll('.msg.assistant'); return a[a.length - 1].dataset.raw;"
    )
    assert shown == os.environ["PI2_EXPECTED"], (shown, os.environ["PI2_EXPECTED"])

    # Markdown from DOM nodes: code blocks in <pre><code>, no HTML from model text.
    got = driver.execute_script(
        r"""const d = document.createElement('div');
        render(d, "<script>window.pwned = 1<\/script> **bold** `x<y`\n```js\nif (a < b) { go(); }\n```\nafter");
        document.body.appendChild(d);
        return [d.querySelectorAll('script').length, d.querySelector('pre code').textContent,
                d.querySelector('strong').textContent, d.querySelector(':not(pre) > code').textContent,
                d.textContent.includes('<script>'), window.pwned === undefined,
                getComputedStyle(d.querySelector('pre code')).fontFamily];"""
    )
    assert got[:6] == [0, "if (a < b) { go(); }", "bold", "x<y", True, True], got
    assert "mono" in got[6].lower() or "menlo" in got[6].lower() or "consolas" in got[6].lower(), got[6]

    # Lists, tables, headings; a copy button on each code block.
    got = driver.execute_script(
        r"""const d = document.createElement('div');
        render(d, "## Plan\n- one **a**\n- two\n\n1. first\n2. second\n\n| k | v |\n|---|---|\n| x | `1<2` |\n```\ncode\n```");
        document.body.appendChild(d);
        return [d.querySelector('h4') && d.querySelector('h4').textContent,
                d.querySelectorAll('ul > li').length, d.querySelector('ul strong').textContent,
                d.querySelectorAll('ol > li').length, d.querySelectorAll('th').length,
                d.querySelector('td code').textContent, d.querySelectorAll('pre > button.copy').length,
                d.querySelector('pre code').textContent];"""
    )
    assert got == ["Plan", 2, "a", 2, 2, "1<2", 1, "code"], got

    # The system prompt goes with the next request; Stop ends a long answer, keeping its text.
    driver.execute_script(
        """window.bodies = [];
        const f = window.fetch;
        window.fetch = (u, o) => { if (o && o.body) window.bodies.push(JSON.parse(o.body)); return f(u, o); };"""
    )
    system = driver.find_element(By.ID, "system")
    system.send_keys("You are a pirate.")
    mt = driver.find_element(By.ID, "max-tokens")
    mt.clear()
    mt.send_keys("400")
    box.send_keys("Tell me a very long story about the sea.")
    box.send_keys(Keys.ENTER)
    time.sleep(1.5)
    driver.find_element(By.ID, "stop").click()
    deadline = time.time() + 10
    while time.time() < deadline and not driver.find_element(By.ID, "send").is_enabled():
        time.sleep(0.05)
    assert driver.find_element(By.ID, "send").is_enabled(), "Stop did not end the answer"
    assert not driver.find_elements(By.CSS_SELECTOR, ".msg.error"), "Stop showed an error"
    sent = driver.execute_script("return window.bodies")[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "You are a pirate."}, sent
    stopped = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].text
    assert stopped.strip(), "the stopped answer lost its text"

    # A reload keeps the conversation (two questions, two answers) and the system prompt.
    driver.refresh()
    assert len(driver.find_elements(By.CSS_SELECTOR, ".msg.user")) == 2
    assert len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
    assert driver.find_element(By.ID, "system").get_attribute("value") == "You are a pirate."
    print(f"chat page: answer streamed in {len(seen)} steps: {final[:60]!r}; {stats}; Markdown, Stop, system prompt, kept")
finally:
    driver.quit()
