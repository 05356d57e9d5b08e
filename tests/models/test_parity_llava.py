"""LLaVA-1.5 (tiny random LlavaForConditionalGeneration) vs transformers: images in through the offline API's
multi_modal_data, greedy tokens identical for 32 steps, top-5 logprobs close; two images of different sizes in one
batch beside a text-only request, prefilled in chunks that split the images; the prefix cache keyed by pixels."""
import pytest
import torch

from hearth import LLM, SamplingParams
from hearth.errors import ParamError
from tests.tiny_vlm import build_llava, hf_llava_greedy, test_image

STEPS = 32
ATOL = 2e-3  # float32 both sides


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return build_llava(str(tmp_path_factory.mktemp("llava") / "tiny-llava"))


def _generate(llm: LLM, prompts: list[tuple[str, list]]):
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=5)
    return llm.generate([{"prompt": text, "multi_modal_data": {"image": images}} if images else text
                         for text, images in prompts], params)


def _assert_same(expected, outs) -> None:
    for i, ((hf_ids, hf_tokens, hf_tops), out) in enumerate(zip(expected, outs)):
        assert out.prompt_token_ids == hf_ids, f"prompt {i}: placeholder expansion differs from LlavaProcessor's"
        got = out.outputs[0]
        assert got.token_ids == hf_tokens, f"prompt {i}: tokens differ"
        for step, ((hf_top, hf_vals), lp) in enumerate(zip(hf_tops, got.logprobs)):
            ours = dict(lp.top)
            for tok, val in zip(hf_top, hf_vals):
                if tok in ours:
                    assert abs(ours[tok] - val) < ATOL, f"prompt {i} step {step} token {tok}"
            assert abs(lp.top[0][1] - hf_vals[0]) < ATOL


def test_two_images_of_different_sizes_beside_text_chunked(folder: str) -> None:
    prompts = [("<image>\nThe quick brown fox", [test_image(40, 30, seed=1)]),
               ("hearth serves language models", []),
               ("Paris is<image> the capital of", [test_image(64, 80, seed=2)])]
    expected = hf_llava_greedy(folder, prompts, STEPS)
    # (a budget of 12 rows: each image's 16 tokens are prefilled over two or three steps)
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=12)
    _assert_same(expected, _generate(llm, prompts))
    cache = llm.engine.runner.encoder_cache
    assert cache.num_encoded == 2, "each image is encoded once, however its prompt is chunked"
    bm = llm.engine.block_manager
    assert bm.num_used_blocks == 0 and bm.req_blocks == {}, "KV blocks leaked"


def test_preemption_and_an_encoder_cache_that_keeps_nothing(folder: str) -> None:
    """A KV cache too small for every request preempts (recompute re-encodes the image), and an encoder cache of
    zero bytes still keeps an image's output until its last token is prefilled: the tokens stay transformers'."""
    prompts = [("<image>\nThe quick brown fox", [test_image(40, 30, seed=1)]),
               ("Paris is<image> the capital of", [test_image(64, 80, seed=2)]),
               ("<image> hearth", [test_image(50, 50, seed=3)])]
    expected = hf_llava_greedy(folder, prompts, STEPS)
    # (8 blocks of 16 tokens of the tiny model's 2 x 2 x 16 x 4-byte KV; the three requests need 12)
    llm = LLM(folder, dtype="float32", kv_cache_space=8 * 8192 / 2**30, max_model_len=96,
              max_num_batched_tokens=12, mm_cache_gb=0)
    _assert_same(expected, _generate(llm, prompts))
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.runner.encoder_cache.entries == {}
    bm = llm.engine.block_manager
    assert bm.num_used_blocks == 0 and bm.req_blocks == {}, "KV blocks leaked"


def test_two_images_in_one_prompt(folder: str) -> None:
    prompts = [("<image> and <image>: which is brighter?", [test_image(50, 50, seed=3), test_image(33, 70, seed=4)])]
    expected = hf_llava_greedy(folder, prompts, STEPS)
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64)
    _assert_same(expected, _generate(llm, prompts))


def test_cls_kept_and_two_feature_layers(tmp_path) -> None:
    """vision_feature_select_strategy "full" (the CLS position is an image token too) and vision_feature_layer as
    a list (the layers' states concatenated before the projector)."""
    folder = build_llava(str(tmp_path / "llava-full"), seed=1, vision_feature_select_strategy="full",
                         vision_feature_layer=[-3, -1], projector_hidden_act="gelu_pytorch_tanh")
    prompts = [("Paris is<image> the capital of", [test_image(64, 48, seed=8)])]
    expected = hf_llava_greedy(folder, prompts, STEPS)
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64)
    _assert_same(expected, _generate(llm, prompts))


def test_engine_checks_image_inputs(folder: str, tmp_path) -> None:
    """add_request refuses images whose positions are not image tokens of the prompt, and a text-only model
    refuses images by name; nothing is queued."""
    from hearth.multimodal.inputs import image_input
    from tests.tiny_models import build_checkpoint, tiny_config

    llm = LLM(folder, dtype="float32", kv_cache_space=0.05)
    token = llm.engine.vision.image_token_id
    pixels = torch.zeros(3, 32, 32)
    params = SamplingParams(max_tokens=2)
    with pytest.raises(ParamError, match="not a run of image tokens"):
        llm.engine.add_request("r1", [7, 8] + [token] * 16, params, mm_inputs=[image_input(pixels, 0, 16)])
    with pytest.raises(ParamError, match="not a run of image tokens"):
        llm.engine.add_request("r2", [7, 8] + [token] * 15, params, mm_inputs=[image_input(pixels, 2, 16)])
    with pytest.raises(ParamError, match="that its 0 images do not fill"):  # a placeholder without an image
        llm.engine.add_request("r3", [7, 8, token, 9], params)
    with pytest.raises(ParamError, match="that its 1 images do not fill"):  # one more than the image fills
        llm.engine.add_request("r4", [token] * 17, params, mm_inputs=[image_input(pixels, 0, 16)])
    assert not llm.engine.has_unfinished_requests()
    text_only = LLM(build_checkpoint(str(tmp_path / "text"), tiny_config("llama")), dtype="float32",
                    kv_cache_space=0.05)
    with pytest.raises(ParamError, match="takes text only"):
        _generate(text_only, [("a picture: <s>", [test_image(8, 8, seed=9)])])
    assert not text_only.engine.has_unfinished_requests()


def test_prefix_cache_keys_image_positions_by_pixels(folder: str) -> None:
    """The same image again is served from the prefix cache and the encoder cache (no second encode); the same
    text with another image shares no block past the text before the image."""
    text = "The quick brown fox jumps over the lazy dog. Paris is <image> what"
    a, b = [test_image(40, 40, seed=5)], [test_image(40, 40, seed=6)]
    expected = hf_llava_greedy(folder, [(text, a), (text, b)], STEPS)
    assert expected[0][1] != expected[1][1], "the two images should lead to different answers"
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64, block_size=8)
    first = _generate(llm, [(text, a)])
    _assert_same(expected[:1], first)
    image_at = first[0].prompt_token_ids.index(llm.engine.vision.image_token_id)
    encoded = llm.engine.runner.encoder_cache.num_encoded
    again = _generate(llm, [(text, a)])
    _assert_same(expected[:1], again)
    assert again[0].num_cached_tokens > image_at, "the same image's blocks were not reused"
    assert llm.engine.runner.encoder_cache.num_encoded == encoded
    other = _generate(llm, [(text, b)])
    _assert_same(expected[1:], other)
    assert other[0].num_cached_tokens <= image_at, "a block holding another image's tokens was reused"


def test_images_must_match_placeholders_and_limit(folder: str) -> None:
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05, limit_mm_per_prompt='{"image": 1}')
    img = test_image(32, 32, seed=7)
    with pytest.raises(ParamError, match="placeholders"):
        _generate(llm, [("no placeholder here", [img])])
    with pytest.raises(ParamError, match="more than the 1"):
        _generate(llm, [("<image><image>", [img, img])])
    bm = llm.engine.block_manager
    assert bm.num_used_blocks == 0 and not llm.engine.has_unfinished_requests()


def test_offline_chat_with_images(folder: str) -> None:
    """LLM.chat: an image_pil part and an image_url data-URL part answer as generate does on the rendered prompt
    with the same images."""
    import base64
    import io

    a, b = test_image(40, 30, seed=1), test_image(30, 40, seed=2)
    buf = io.BytesIO()
    b.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    chat = llm.chat([{"role": "user", "content": [{"type": "image_pil", "image_pil": a},
                                                   {"type": "text", "text": "and"},
                                                   {"type": "image_url", "image_url": {"url": url}}]}], params)
    prompt = "<|im_start|>user\n<image>\nand\n<image><|im_end|>\n<|im_start|>assistant\n"
    want = llm.generate({"prompt": prompt, "multi_modal_data": {"image": [a, b]}}, params)
    assert chat[0].prompt_token_ids == want[0].prompt_token_ids
    assert chat[0].outputs[0].token_ids == want[0].outputs[0].token_ids
