"""Images through the real server: OpenAI chat image_url parts (base64 data URLs) on a tiny random LLaVA answer as
the offline API does on the same prompt and image; every bad image is a 400 with an OpenAI-style body naming the
problem, and the server goes on serving with no KV blocks held."""
from __future__ import annotations

import base64
import io
import struct

import httpx
import pytest

from tests.server.conftest import ServerProcess, start_server
from tests.tiny_vlm import build_llava, test_image

QUESTION = "What is in the picture?"


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def chat_body(*urls: str, text: str = QUESTION) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": text}]
    return {"model": "tiny-llava", "messages": [{"role": "user", "content": parts}], "max_tokens": 8,
            "temperature": 0}


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory) -> str:
    return build_llava(str(tmp_path_factory.mktemp("llava-srv") / "tiny-llava"))


@pytest.fixture(scope="module")
def vlm_server(llava_folder: str, tmp_path_factory) -> ServerProcess:
    srv = start_server([llava_folder, "--served-model-name", "tiny-llava", "--dtype", "float32", "--kv-cache-space",
                        "0.05", "--threads", "1", "--limit-mm-per-prompt", '{"image": 2}',
                        "--allowed-media-domains", "127.0.0.1"],
                       str(tmp_path_factory.mktemp("logs") / "llava.log"))
    yield srv
    srv.stop()


def _post(srv: ServerProcess, body: dict) -> httpx.Response:
    return srv.http.post("/v1/chat/completions", json=body, timeout=120)


def test_chat_image_url_answers_as_offline(vlm_server: ServerProcess, llava_folder: str) -> None:
    from hearth import LLM, SamplingParams

    img = test_image(48, 36, seed=11)
    got = vlm_server.client().chat.completions.create(**chat_body(data_url(png(img))))
    other = _post(vlm_server, chat_body(data_url(png(test_image(48, 36, seed=12))))).json()
    llm = LLM(llava_folder, dtype="float32", kv_cache_space=0.05)
    prompt = f"<|im_start|>user\n<image>\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    # (the server read the PNG back: the same pixels as img)
    want = llm.generate({"prompt": prompt, "multi_modal_data": {"image": img}},
                        SamplingParams(temperature=0, max_tokens=8))[0]
    assert got.choices[0].message.content == want.outputs[0].text
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    assert other["choices"][0]["message"]["content"] != got.choices[0].message.content, "the image was not read"


def test_http_image_from_an_allowed_host(vlm_server: ServerProcess) -> None:
    """--allowed-media-domains 127.0.0.1: an http URL there is fetched and answered as the same image sent inline;
    a missing one is a 400 naming the HTTP status."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    image = png(test_image(30, 30, seed=19))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            found = self.path == "/cat.png"
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(image) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(image)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        fetched = _post(vlm_server, chat_body(f"{base}/cat.png"))
        inline = _post(vlm_server, chat_body(data_url(image)))
        assert fetched.status_code == 200, fetched.text
        assert fetched.json()["choices"][0]["message"] == inline.json()["choices"][0]["message"]
        missing = _post(vlm_server, chat_body(f"{base}/dog.png"))
        assert missing.status_code == 400 and "HTTP 404" in missing.json()["error"]["message"]
    finally:
        httpd.shutdown()


def _truncated_png() -> bytes:
    data = png(test_image(64, 64, seed=13))
    return data[: len(data) // 2]


def _bmp_declaring(width: int, height: int) -> bytes:
    """A BMP whose header declares width x height (its pixels absent): the size is refused from the header."""
    buf = io.BytesIO()
    test_image(4, 4, seed=14).save(buf, format="BMP")
    data = bytearray(buf.getvalue())
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)


def _tiff() -> bytes:
    buf = io.BytesIO()
    test_image(8, 8, seed=15).save(buf, format="TIFF")
    return buf.getvalue()


BAD = {  # case -> (image urls, words the message must contain)
    "corrupt": ([data_url(b"this is not an image at all")], "not an image"),
    "truncated": ([data_url(_truncated_png())], "truncated or corrupt"),
    "bad-base64": (["data:image/png;base64,@@@not-base64@@@"], "not valid base64"),
    "unsupported-format": ([data_url(_tiff(), "image/tiff")], "unsupported image format TIFF"),
    "oversized": ([data_url(_bmp_declaring(20000, 20000), "image/bmp")], "scale it down"),
    "too-many": ([data_url(png(test_image(8, 8, seed=16)))] * 3, "more than the 2"),
    "fifty": ([data_url(png(test_image(8, 8, seed=16)))] * 50, "50 images"),
    "http-not-allowed": (["http://images.example/cat.png"], "--allowed-media-domains"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_image_is_a_400_naming_it(vlm_server: ServerProcess, case: str) -> None:
    urls, words = BAD[case]
    r = _post(vlm_server, chat_body(*urls))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error" and err["param"] == "messages"
    health = vlm_server.health()
    assert health["kv_used_blocks"] == 0 and health["num_requests_running"] == 0
    ok = _post(vlm_server, chat_body(data_url(png(test_image(20, 20, seed=17)))))
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


def test_image_to_a_text_only_model_is_a_400(server: ServerProcess) -> None:
    r = server.http.post("/v1/chat/completions", json={**chat_body(data_url(png(test_image(8, 8, seed=18)))),
                                                       "model": None}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "takes text only" in err["message"] and err["param"] == "messages"
    assert server.health()["kv_used_blocks"] == 0
    ok = server.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200


def test_images_cross_to_worker_processes(llava_folder: str, vlm_server: ServerProcess, tmp_path) -> None:
    """Data parallel: the engines run in worker processes; the image inputs cross the pipe with the request and
    the answer is the in-process server's."""
    body = chat_body(data_url(png(test_image(48, 36, seed=21))))
    want = _post(vlm_server, body).json()["choices"][0]["message"]
    srv = start_server([llava_folder, "--served-model-name", "tiny-llava", "--dtype", "float32", "--kv-cache-space",
                        "0.05", "--threads", "1", "--data-parallel-size", "2"], str(tmp_path / "dp.log"))
    try:
        for _ in range(2):  # (both workers, least-busy routing)
            r = _post(srv, body)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"] == want
    finally:
        srv.stop()


def test_image_metrics(vlm_server: ServerProcess) -> None:
    """/metrics counts encodes and encoder-cache hits: the same image after other text is not encoded again."""
    from tests.server.conftest import wait_until

    url = data_url(png(test_image(26, 26, seed=22)))
    encoded = vlm_server.metric("hearth:mm_images_encoded_total")
    hits = vlm_server.metric("hearth:mm_encoder_cache_hits_total")
    assert _post(vlm_server, chat_body(url)).status_code == 200
    assert wait_until(lambda: vlm_server.metric("hearth:mm_images_encoded_total") == encoded + 1)
    # (other text before the image: the prefix cache cannot serve its tokens, the encoder cache does)
    body = chat_body(url)
    body["messages"][0]["content"].insert(0, {"type": "text", "text": "Something else comes first"})
    assert _post(vlm_server, body).status_code == 200
    assert wait_until(lambda: vlm_server.metric("hearth:mm_encoder_cache_hits_total") == hits + 1)
    assert vlm_server.metric("hearth:mm_images_encoded_total") == encoded + 1
    assert vlm_server.metric("hearth:mm_encoder_seconds_total") > 0


def test_ollama_images(vlm_server: ServerProcess) -> None:
    """Ollama's chat and generate take base64 `images` (its client encodes the bytes) and answer as the OpenAI
    route does for the same image and text; a corrupt one is a 400 in Ollama's error shape."""
    import ollama

    image = png(test_image(36, 44, seed=23))
    want = _post(vlm_server, chat_body(data_url(image)))
    assert want.status_code == 200, want.text
    oc = ollama.Client(host=vlm_server.url, timeout=120)
    options = {"temperature": 0, "num_predict": 8}
    chat = oc.chat(model="tiny-llava", messages=[{"role": "user", "content": QUESTION, "images": [image]}],
                   options=options)
    assert chat.message.content == want.json()["choices"][0]["message"]["content"]
    gen = oc.generate(model="tiny-llava", prompt=QUESTION, images=[image], options=options)
    assert gen.response == chat.message.content
    bad = vlm_server.http.post("/api/chat", json={"model": "tiny-llava", "stream": False, "messages": [
        {"role": "user", "content": "hi", "images": [base64.b64encode(b"not an image").decode()]}]})
    assert bad.status_code == 400 and "not an image" in bad.json()["error"]


def test_anthropic_and_responses_images(vlm_server: ServerProcess) -> None:
    """Anthropic image blocks (base64) and Responses input_image parts answer as OpenAI chat does for the same
    image and text; a corrupt image is a 400 on each."""
    import anthropic
    import openai

    image = png(test_image(40, 28, seed=24))
    want = _post(vlm_server, chat_body(data_url(image))).json()["choices"][0]["message"]["content"]
    ac = anthropic.Anthropic(base_url=vlm_server.url, api_key="none", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
    msg = ac.messages.create(model="tiny-llava", max_tokens=8, extra_body={"temperature": 0},
                             messages=[{"role": "user", "content": content}])
    assert msg.content[0].text == want
    counted = ac.messages.count_tokens(model="tiny-llava", messages=[{"role": "user", "content": content}])
    assert counted.input_tokens == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    r = vlm_server.client().responses.create(model="tiny-llava", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(image)},
                                     {"type": "input_text", "text": QUESTION}]}])
    assert r.output_text == want
    with pytest.raises(anthropic.BadRequestError, match="not an image"):
        ac.messages.create(model="tiny-llava", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {**source, "data": base64.b64encode(b"junk").decode()}}]}])
    with pytest.raises(openai.BadRequestError, match="not an image"):
        vlm_server.client().responses.create(model="tiny-llava", max_output_tokens=8, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": data_url(b"junk")}]}])
    assert vlm_server.health()["kv_used_blocks"] == 0


def test_placeholder_without_an_image_is_a_400(vlm_server: ServerProcess) -> None:
    r = _post(vlm_server, chat_body(text="<image> is typed here, but no image is sent"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "image tokens" in r.json()["error"]["message"]
    assert vlm_server.health()["kv_used_blocks"] == 0
