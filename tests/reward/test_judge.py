"""LLM judges: verdict parsing, a judge served by the embedded model through the HF engine in a training
run, and the OpenAI-compatible server client (against a local HTTP server)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from omegaconf import OmegaConf

from rlplat.reward import RewardConfigError, RewardFailure, RewardValue, build_reward_manager
from rlplat.reward.judge import ServerJudge, check_template, judge_prompts, parse_verdict, question_of
from rlplat.trainer.run import load_run_config, run
from rlplat.utils.errors import RunError


@pytest.mark.parametrize("text, verdict, expected", [
    ("The response is right.\nScore: 8", "score", 0.8),
    ("score = 10", "score", 1.0),
    ("I'd say 3 out of... no, 7", "score", 0.7),  # no "Score:": the last number
    ("Score: 4\nOn reflection, Score: 6", "score", 0.6),
    ("Score: 11", "score", None),  # out of [0, 10]
    ("no idea", "score", None),
    ("Yes, it matches.", "yes_no", 1.0),
    ("yes... actually NO", "yes_no", 0.0),  # the last one
    ("maybe", "yes_no", None),
    ("noyes", "yes_no", None),  # words only
])
def test_parse_verdict(text, verdict, expected):
    outcome = parse_verdict(text, verdict, 0.0, 10.0, 3)
    if expected is None:
        assert isinstance(outcome, RewardFailure) and outcome.kind == "bad_value"
        assert "sample 3" in outcome.message and repr(text.strip())[:20] in outcome.message
    else:
        assert outcome == RewardValue(pytest.approx(expected))


def test_judge_prompts_fill_question_response_reference():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}]
    assert question_of(messages) == "2+2="
    assert judge_prompts("Q {question} R {response} T {reference} {{x}}", [messages], ["4"], [4]) == ["Q 2+2= R 4 T 4 {x}"]
    with pytest.raises(ValueError, match=r"reward.judge.prompt_template: KeyError 'answer'"):
        check_template("{answer}")
    with pytest.raises(RewardConfigError, match="KeyError 'answer'"):
        build_reward_manager({"functions": ["judge"], "judge": {"url": "http://x/v1", "prompt_template": "{answer}"}})


JUDGE = ["reward.judge.prompt_template='{response}+0='", "reward.judge.score_max=50", "reward.judge.max_new_tokens=4"]


def judge_run(tmp_path, small_val, *extra):
    cfg, plan = load_run_config([
        "trainer.ray_address=inprocess", f"trainer.output_dir={tmp_path}", f"data.val_files={small_val}",
        "trainer.total_steps=1", "data.train_batch_size_prompts=8", "rollout.n=4", "trainer.test_freq=0",
        "reward.judge.model_path=embedded", *JUDGE, *extra])
    return run(cfg, plan)


@pytest.mark.slow
def test_a_judge_served_by_the_embedded_model_scores_and_its_unreadable_answers_are_counted(
        embedded_cache, small_val, tmp_path):
    # The embedded model "judges" by adding 0 to the response: its answer is a number, over 50 now and then
    # (then the verdict is not a score in [0, 50]: a failed call, counted, named, and the run goes on).
    judge_run(tmp_path / "goes-on", small_val)
    step = next(json.loads(line) for line in (tmp_path / "goes-on" / "metrics.jsonl").read_text().splitlines()
                if json.loads(line)["step"] == 1)
    assert 0 < step["reward_calls/judge_errors"] < 32 and step["reward/num_errors"] == step["reward_calls/judge_errors"]
    assert 0 < step["reward/judge_mean"] <= 1
    with pytest.raises(RunError, match=r"reward calls failed \(reward.fail_fraction_to_stop=0.01\).*"
                                       r"the judge's answer on sample \d+ is not a score in \[0, 50\]"):
        judge_run(tmp_path / "stops", small_val, "reward.fail_fraction_to_stop=0.01")


class JudgeServer(BaseHTTPRequestHandler):
    """A chat-completions endpoint: the judge's answer is the response text after "R:" in the prompt."""

    seen_keys: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        JudgeServer.seen_keys.append(self.headers.get("Authorization"))
        answer = body["messages"][0]["content"].split("R:", 1)[1].strip()
        if answer == "slow":
            time.sleep(1.5)  # past the client's 1 s timeout: the answer below meets a closed connection
        if answer == "error":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the "slow" sample); said nowhere, or it lands in another test's output

    def log_message(self, *args):
        pass


class JoiningServer(ThreadingHTTPServer):
    """Closing waits for every request's thread, so none outlives the test that started it."""

    daemon_threads = False


def test_the_server_judge_asks_concurrently_with_the_key_from_the_environment(monkeypatch):
    server = JoiningServer(("127.0.0.1", 0), JudgeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    cfg = OmegaConf.create({"url": f"http://127.0.0.1:{server.server_port}/v1", "model": "judge", "timeout_s": 1.0,
                            "max_new_tokens": 16, "temperature": 0.0, "api_key_env": "MY_JUDGE_KEY", "concurrency": 4})
    try:
        start = time.monotonic()
        answers = ServerJudge(cfg).answers([f"R: {r}" for r in ["Score: 9", "slow", "error", "Score: 2", "nonsense"]])
        elapsed = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    assert answers[0] == "Score: 9" and answers[3] == "Score: 2" and answers[4] == "nonsense"
    assert isinstance(answers[1], BaseException) and "timeout 1 s" in str(answers[1])
    assert isinstance(answers[2], BaseException) and "answered 500 on sample 2: overloaded" in str(answers[2])
    assert elapsed < 2.5  # concurrent: the slow one costs its timeout once
    assert set(JudgeServer.seen_keys) == {"Bearer sk-test"}
    outcomes = [parse_verdict(a, "score", 0, 10, i) for i, a in enumerate(answers) if isinstance(a, str)]
    assert [o.score if isinstance(o, RewardValue) else "error" for o in outcomes] == [0.9, 0.2, "error"]


def test_judge_config_rules():
    from rlplat.config import ConfigError

    with pytest.raises(ConfigError, match="reward.judge.url needs reward.judge.model"):
        load_run_config(["reward.judge.url=http://localhost:1/v1"])
    with pytest.raises(ConfigError, match="are both set"):
        load_run_config(["reward.judge.url=http://localhost:1/v1", "reward.judge.model=m", "reward.judge.model_path=x"])
    cfg, _ = load_run_config(["reward.judge.url=http://localhost:1/v1", "reward.judge.model=m"])
    assert "sk-" not in json.dumps(OmegaConf.to_container(cfg))  # only the variable's name is in the config
    assert build_reward_manager(cfg.reward).names == ["judge"]
