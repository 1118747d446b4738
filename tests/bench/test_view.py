"""``vt-bench view``: the HTML it writes (escaping, counts, filter attributes, inputs), and
the page in a real headless browser (Debian's chromium; skipped where it is absent —
``.ci/run`` installs it): a filter given in the URL fragment, the DOM after the page's
script ran, a screenshot."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from vt_bench import view
from vt_bench.__main__ import main as bench_main
from vt_bench.view_render import split_transcript
from vt_envs.errors import InvalidConfigError

EVIL = "<script>document.body.setAttribute('data-pwned','1')</script>"
EVIL_IMG = "<img src=x onerror=\"document.body.setAttribute('data-pwned','2')\">"
# A 1x1 PNG.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d4944415478da63f8cfc0f01f0005000201a5f4b1d3"
        "0000000049454e44ae426082"
    )
).decode()


def _record(env: str, task: str, *, kind=None, reward=1.0, ok=True, truncated=False, sample=0,
            action="<answer>4</answer>", transcript=None, **extra):  # fmt: skip
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    return {
        "env_id": env, "task_id": task, "sample": sample, "kind": kind, "task": {"kind": kind},
        "reward": reward, "correct": reward >= 1.0, "reward_parts": {"outcome": reward},
        "truncated": truncated, "truncation": "max_turns" if truncated else None,
        "turns": [{"tokens_in": 17, "tokens_out": 5, "finish_reason": "stop", "action": action}],
        "tool_calls": [{"turn": 0, "name": "python", "ok": ok,
                        "error": None if ok else "timeout", "latency_s": 0.002}],
        "transcript": transcript if transcript is not None else prompt + action + "\nok",
        "error": None, **extra,
    }  # fmt: skip


def _records():
    return [
        _record("VT-Math-v0", "m/0", kind="modpow", reward=1.0),
        _record("VT-Math-v0", "m/1", kind="modpow", reward=0.0),
        _record("VT-Math-v0", "m/2", kind="digit_sum", reward=0.0, ok=False),
        _record("VT-Math-v0", "m/3", kind="digit_sum", reward=0.5, truncated=True),
        _record("VT-Lookup-v0", "l/0", reward=1.0),
        _record("VT-Lookup-v0", "l/1", reward=0.0, action=EVIL, transcript="p " + EVIL + " o"),
        _record(
            "VT-Visual-v0",
            "v/0",
            kind="color",
            reward=1.0,
            action="<zoom>" + EVIL_IMG,
            transcript="<image>\nQ?<zoom>" + EVIL_IMG + "Image 1\n<image>",
            images=[f"data:image/png;base64,{PNG}", "javascript:alert(1)"],
        ),
    ]


def _write_eval(directory: Path, records, *, gz=False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    if gz:
        (directory / "rollouts.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (directory / "rollouts.jsonl").write_text(text + '{"env_id": "torn', encoding="utf-8")
    return directory


class _Rollouts(HTMLParser):
    """The ``<details class="rollout">`` elements' attributes, and the body's."""

    def __init__(self):
        super().__init__()
        self.rollouts, self.body, self.scripts = [], {}, 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "details" and attrs.get("class") == "rollout":
            self.rollouts.append(attrs)
        elif tag == "body":
            self.body = attrs
        elif tag == "script":
            self.scripts += 1


def _parse(html: str) -> _Rollouts:
    parser = _Rollouts()
    parser.feed(html)
    return parser


def _page(records=None, **kwargs) -> str:
    rollouts = [view.from_record(r) for r in (records or _records())]
    return view.build_page(rollouts, **kwargs)


def test_model_text_is_escaped_never_markup():
    html = _page()
    parsed = _parse(html)
    assert parsed.scripts == 1  # the page's own filter script, nothing from a transcript
    assert "<script>document" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.body.setAttribute(&#x27;data-pwned&#x27;" in html
    assert "&lt;img src=x onerror=" in html
    # the good image inline, the javascript: one dropped, the unmatched placeholder as text
    assert f'<img src="data:image/png;base64,{PNG}" alt="image">' in html
    assert "javascript:" not in html
    assert "&lt;image&gt;" in html
    # no element but the rollouts' <details> carries data from the records
    assert all(not k.startswith("on") for r in parsed.rollouts for k in r)


def test_filter_attributes_and_counts():
    html = _page()
    rollouts = _parse(html).rollouts
    assert [r["data-env"] for r in rollouts] == ["VT-Math-v0"] * 4 + ["VT-Lookup-v0"] * 2 + [
        "VT-Visual-v0"
    ]
    assert [r["data-solved"] for r in rollouts] == ["1", "0", "0", "0", "1", "0", "1"]
    assert [r["data-tool-error"] for r in rollouts] == ["0", "0", "1", "0", "0", "0", "0"]
    assert [r["data-truncated"] for r in rollouts] == ["0", "0", "0", "1", "0", "0", "0"]
    assert [r["data-kind"] for r in rollouts][:4] == ["modpow", "modpow", "digit_sum", "digit_sum"]
    assert rollouts[3]["data-reward"] == "0.5"
    assert '<b id="shown">7</b> of 7 shown' in html
    assert "read 17 tokens · wrote 5 · stop: stop" in html  # token counts per turn
    assert "tool python → error: timeout (2.0 ms)" in html

    rows = {
        (r["env"], r["kind"]): r
        for r in view.summary_rows([view.from_record(r) for r in _records()])
    }
    math = rows[("VT-Math-v0", None)]
    assert (math["episodes"], math["solved"], math["mean_reward"]) == (4, 0.25, 0.375)
    assert (math["truncated"], math["tool_error"], math["tokens_in"]) == (1, 1, 17)
    assert rows[("VT-Math-v0", "digit_sum")]["episodes"] == 2
    assert ("VT-Lookup-v0", None) in rows and len(rows) == 6  # 3 envs + 3 kinds
    # the summary links set the filter
    assert 'href="#env=VT-Math-v0&amp;kind=digit_sum"' in html


def test_max_rollouts_caps_in_turn_over_envs_but_summary_counts_all():
    records = [_record("VT-Math-v0", f"m/{i}") for i in range(10)] + [
        _record("VT-SQL-v0", f"s/{i}") for i in range(3)
    ]
    html = _page(records, max_rollouts=4)
    rollouts = _parse(html).rollouts
    assert [r["data-env"] for r in rollouts] == ["VT-Math-v0"] * 2 + ["VT-SQL-v0"] * 2
    assert "4 of 13 rollouts embedded" in html
    rows = view.summary_rows([view.from_record(r) for r in records])
    assert [row["episodes"] for row in rows] == [10, 3]  # the summary: every rollout


def test_long_text_is_cut_in_the_middle():
    action = "A" * 300 + "<answer>1</answer>"
    html = _page([_record("VT-Math-v0", "m/0", action=action)], max_chars=100)
    assert "characters cut (--max-chars 100)" in html
    assert "A" * 300 not in html and "&lt;answer&gt;1&lt;/answer&gt;" in html


def test_split_transcript_places_actions_from_the_end():
    # the worked example repeats the first action; the episode's is the last one
    text = "sys <a>1</a> demo\nQ <a>1</a>out1 <b>2</b>out2"
    prompt, observations = split_transcript(text, ["<a>1</a>", "<b>2</b>"])
    assert prompt == "sys <a>1</a> demo\nQ "
    assert observations == ["out1 ", "out2"]
    assert split_transcript(text, ["<c>"]) is None


def test_reads_gz_and_run_dirs_and_the_cli_writes_one_file(tmp_path, capsys):
    _write_eval(tmp_path / "plain", _records())
    _write_eval(tmp_path / "gz", _records(), gz=True)
    plain, _ = view.load(tmp_path / "plain")  # the torn last line is dropped
    gz, _ = view.load(tmp_path / "gz")
    assert len(plain) == len(gz) == 7

    run = tmp_path / "run"
    (run / "transcripts").mkdir(parents=True)
    (run / "config.yaml").write_text("env:\n  id: VT-Math-v0\n")
    (run / "transcripts" / "eval_step0000.txt").write_text(
        "===== task math/test/0 | reward 1 | turns 2 | tool calls 1 =====\nhello <b>\n\n"
        "===== task math/test/1 | reward 0 | turns 1 | tool calls 0 =====\nbye\n"
    )
    rollouts, _ = view.load(run)
    assert [(r["env"], r["task_id"], r["solved"], r["step"]) for r in rollouts] == [
        ("VT-Math-v0", "math/test/0", True, "eval_step0000"),
        ("VT-Math-v0", "math/test/1", False, "eval_step0000"),
    ]
    assert bench_main(["view", str(run), "--out", str(tmp_path / "run.html")]) == 0
    html = (tmp_path / "run.html").read_text()
    assert "hello &lt;b&gt;" in html and 'data-step="eval_step0000"' in html

    assert bench_main(["view", str(tmp_path / "gz")]) == 0
    assert (tmp_path / "gz" / "view.html").is_file()
    assert "7 of 7 rollouts embedded" in capsys.readouterr().out
    with pytest.raises(InvalidConfigError, match=r"neither rollouts\.jsonl"):
        view.load(tmp_path)


# ------------------------------------------------------------------ the browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args]  # fmt: skip
    return subprocess.run(
        command, capture_output=True, text=True, timeout=180, check=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip


def _visible(dom: str) -> list[tuple[str, str]]:
    shown = []
    for r in _parse(dom).rollouts:
        assert ("hidden" in r) != (r.get("data-visible") == "1"), r
        if "hidden" not in r:
            shown.append((r["data-env"], r["id"]))
    return shown


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs it)")
def test_in_headless_chromium_the_fragment_filters_and_nothing_runs(tmp_path):
    page = tmp_path / "view.html"
    page.write_text(_page(), encoding="utf-8")
    url = page.as_uri()

    dom = _chromium(tmp_path, "--dump-dom", url + "#env=VT-Math-v0&solved=0").stdout
    assert _visible(dom) == [("VT-Math-v0", "r1"), ("VT-Math-v0", "r2"), ("VT-Math-v0", "r3")]
    assert '<b id="shown">3</b>' in dom
    body = _parse(dom).body
    assert "data-pwned" not in body  # the transcripts' <script> and onerror did not run
    assert "&lt;script&gt;document.body.setAttribute" in dom  # shown as text

    dom = _chromium(tmp_path, "--dump-dom", url + "#min_reward=0.5&tool_error=0&kind=").stdout
    assert _visible(dom) == [("VT-Math-v0", "r0"), ("VT-Math-v0", "r3"),
                             ("VT-Lookup-v0", "r4"), ("VT-Visual-v0", "r6")]  # fmt: skip
    dom = _chromium(tmp_path, "--dump-dom", url + "#truncated=1&open=1").stdout
    assert _visible(dom) == [("VT-Math-v0", "r3")]
    assert 'id="r3" ' in dom and " open=" in dom.split('id="r3"')[1].split(">")[0]
    assert "data-pwned" not in _parse(dom).body

    shot = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,900",
              url + "#env=VT-Lookup-v0&open=1")  # fmt: skip
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_question_shown_rest_of_prompt_folded_and_env_option(tmp_path, capsys):
    html = _page([_record("VT-Math-v0", "m/0", transcript="<|im_start|>system\nBe exact."
                          "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                          "<|im_start|>assistant\n<answer>4</answer>\nok")])  # fmt: skip
    folded, question = html.split("</details>", 1)[0], html.split("</details>", 1)[1]
    assert "Be exact." in folded and "prompt (" in folded
    assert "What is 2+2?" in question.split('class="turn"')[0]

    _write_eval(tmp_path / "e", _records())
    assert bench_main(["view", str(tmp_path / "e"), "--env", "VT-Lookup-v0"]) == 0
    rollouts = _parse((tmp_path / "e" / "view.html").read_text()).rollouts
    assert {r["data-env"] for r in rollouts} == {"VT-Lookup-v0"} and len(rollouts) == 2
    with pytest.raises(InvalidConfigError, match="no rollout of"):
        bench_main(["view", str(tmp_path / "e"), "--env", "VT-Nope-v0"])


def test_images_replayed_from_an_eval_record(tmp_path):
    """--images: VT-Visual-v0's task image and its zoom come back by replaying the record of
    docs/eval/oracle; a record whose replay ends with another reward gets none."""
    from vt_bench.view_images import replay_images

    source = Path(__file__).resolve().parents[2] / "docs" / "eval" / "oracle"
    lines = (source / "rollouts.jsonl").read_text().splitlines()
    record = next(json.loads(x) for x in lines if '"env_id":"VT-Visual-v0"' in x)
    assert [t["action"][:11] for t in record["turns"]] == ["<tool_call>", "<answer>A</"]
    tampered = {**record, "sample": 1, "reward": 0.0, "correct": False}
    _write_eval(tmp_path, [record, tampered])
    (tmp_path / "config.json").write_text((source / "config.json").read_text())
    rollouts, _ = view.load(tmp_path)
    assert replay_images(tmp_path, rollouts, side=64) == 1
    good, bad = rollouts
    assert len(good["images"]) == 2 and bad["images"] == []
    assert all(view._DATA_URL.fullmatch(url) for url in good["images"])
    html = view.build_page(rollouts)
    assert html.count('<img src="data:image/jpeg;base64,') == 2
