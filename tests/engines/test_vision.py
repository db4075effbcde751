"""Vision-language models end to end on a tiny Qwen2.5-VL: image rows in verl's and TRL's forms read to the same
ids, bad image rows fail in one line, the HF rollout generates from images and its log-probs are the trainer's
(packed and padded rows, 3-D positions), each row's images stay with it, the frozen vision tower is neither
trained nor synced, and what is not supported is refused at start-up (rlplat.data.vision, rlplat.models.vision)."""

import io

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image, ImageDraw
from transformers import AutoTokenizer

from rlplat.config.errors import ConfigError
from rlplat.controller import InProcessWorkerGroup
from rlplat.data import DataError, RLDataset, collate
from rlplat.data.vision import MULTI_MODAL
from rlplat.engines.base import MicroBatching, micro_batches
from rlplat.models.tiny import build_tiny_vision_model
from rlplat.models.vision import image_inputs_of, rope_positions
from rlplat.protocol import Batch
from rlplat.workers.roles import ActorRolloutRefWorker

from workers.helpers import engine_config, with_training_fields

DATA = {"image_min_pixels": None, "image_max_pixels": None, "truncation": "error"}


@pytest.fixture(scope="module")
def vl_path(tmp_path_factory):
    """A randomly initialised tiny Qwen2.5-VL with its tokenizer and image processor."""
    return str(build_tiny_vision_model(tmp_path_factory.mktemp("tiny-vl"), seed=0))


def png(color, size=(112, 112), shape="ellipse") -> bytes:
    image = Image.new("RGB", size, (255, 255, 255))
    getattr(ImageDraw.Draw(image), shape)((5, 5, size[0] // 2, size[1] // 2), fill=color)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def row(content, images, truth="1"):
    return {"data_source": "shapes", "prompt": [{"role": "user", "content": content}],
            "images": [{"bytes": image, "path": None} for image in images], "reward_model": {"ground_truth": truth}}


def image_inputs(path, **data):
    tokenizer = AutoTokenizer.from_pretrained(path)
    return tokenizer, image_inputs_of(path, tokenizer, OmegaConf.create({**DATA, **data}))


def dataset(tmp_path, path, rows, name="d.parquet", **data):
    tokenizer, images = image_inputs(path, **data)
    pd.DataFrame(rows).to_parquet(tmp_path / name)
    return RLDataset(str(tmp_path / name), tokenizer, 96, data.get("truncation", "error"), images=images)


def vl_prompts(tmp_path, path) -> Batch:
    """Four prompts: one image, two images of other sizes, none, and another image of the first one's size."""
    rows = [row("<image>how many?", [png((255, 0, 0))]),
            row("two: <image> and <image>?", [png((0, 255, 0), (56, 84)), png((0, 0, 255), (100, 60), "rectangle")]),
            row("no image here", []),
            row("<image>how many?", [png((0, 0, 255), (112, 112), "rectangle")])]
    data = dataset(tmp_path, path, rows)
    tensors, lists = collate(data.items, data.tokenizer.pad_token_id, data.images)
    return Batch.from_dict(tensors, non_tensors=lists, meta={"temperature": 1.0})


def test_verl_and_trl_rows_read_to_the_same_ids_and_the_processors_image_tokens(tmp_path, vl_path):
    verl = dataset(tmp_path, vl_path, [row("<image>how many?", [png((255, 0, 0))])], "verl.parquet")
    trl = dataset(tmp_path, vl_path, [row([{"type": "image"}, {"type": "text", "text": "how many?"}],
                                          [png((255, 0, 0))])], "trl.parquet")
    assert verl[0]["prompt_ids"] == trl[0]["prompt_ids"]
    tokenizer, images = image_inputs(vl_path)
    # a 112 x 112 image: 8 x 8 patches of 14 pixels, merged 2 x 2 into 16 image tokens
    assert verl[0]["prompt_ids"].count(images.image_token_id) == 16
    inputs = images.inputs(verl[0]["images"])
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]] and inputs["pixel_values"].shape == (64, 3 * 2 * 14 * 14)
    path = tmp_path / "image.png"  # an image given by its path reads as its bytes do
    path.write_bytes(png((255, 0, 0)))
    by_path = dataset(tmp_path, vl_path, [{**row("<image>how many?", []), "images": [str(path)]}], "path.parquet")
    assert by_path[0]["prompt_ids"] == verl[0]["prompt_ids"]


@pytest.mark.parametrize("rows, expected", [
    ([row("<image><image>two?", [png((255, 0, 0))])], "row 0: the prompt shows 2 image(s)"),
    ([row("<image>?", [png((1, 2, 3))]), row("no placeholder", [png((1, 2, 3))])], "row 1: the prompt shows 0 image(s)"),
    ([row("<image>?", [b"not an image"])], "row 0: cannot decode an image"),
    ([row("<image>?", [png((1, 2, 3), (400, 400))])], "row 0: an image of 400x400 = 160000 pixels is over "
                                                        "data.image_max_pixels=12544"),
    ([{**row("<image>?", []), "images": ["/nonexistent/cat.png"]}], "row 0: image file '/nonexistent/cat.png' does not"),
    ([row([{"type": "video"}], [])], "(videos are not supported)"),
])
def test_a_bad_image_row_is_one_error_naming_the_file_and_row(tmp_path, vl_path, rows, expected):
    with pytest.raises(DataError) as err:
        dataset(tmp_path, vl_path, rows)
    assert f"{tmp_path / 'd.parquet'} {expected}" in str(err.value) or expected in str(err.value)
    assert str(tmp_path / "d.parquet") in str(err.value)


def test_an_image_whose_pixels_do_not_decode_stops_the_batch_naming_its_row(tmp_path, vl_path):
    broken = png((1, 2, 3))[:80]  # its header reads (the size: the prompt's ids), its pixels do not
    data = dataset(tmp_path, vl_path, [row("<image>?", [png((1, 2, 3))]), row("<image>?", [broken])])
    with pytest.raises(DataError, match=rf"{tmp_path / 'd.parquet'} row 1: cannot decode an image"):
        collate(data.items, data.tokenizer.pad_token_id, data.images)


def test_image_rows_need_the_chat_template(tmp_path, vl_path):
    tokenizer, images = image_inputs(vl_path)
    pd.DataFrame([row("<image>?", [png((1, 2, 3))])]).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(DataError, match="row 0: a prompt with images needs data.apply_chat_template=true"):
        RLDataset(str(tmp_path / "d.parquet"), tokenizer, 96, apply_chat_template=False, images=images)


def test_an_image_over_the_limit_is_shrunk_when_truncation_allows(tmp_path, vl_path):
    data = dataset(tmp_path, vl_path, [row("<image>?", [png((1, 2, 3), (400, 400))])], truncation="filter")
    assert data.images.inputs(data[0]["images"])["image_grid_thw"].prod() * 14 * 14 <= 112 * 112


def test_a_text_model_refuses_image_rows_and_text_rows_stay_text(tmp_path):
    from rlplat.models.tiny import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "text"))
    pd.DataFrame([row("<image>?", [png((1, 2, 3))])]).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(DataError, match="row 0: the row has images, but the model has no image processor"):
        RLDataset(str(tmp_path / "d.parquet"), tokenizer, 96)
    # a text dataset's literal "<image>" (no image column), and its own "image" column beside prompts that show
    # no image, are text and data as before
    texts = [{"data_source": "x", "prompt": [{"role": "user", "content": content}],
              "reward_model": {"ground_truth": "1"}, **extra}
             for content, extra in (("what is <image>?", {}), ("a cat", {"image": "https://x.org/cat.png"}))]
    for i, text in enumerate(texts):
        pd.DataFrame([text]).to_parquet(tmp_path / f"t{i}.parquet")
        item = RLDataset(str(tmp_path / f"t{i}.parquet"), tokenizer, 96)[0]
        assert item["raw_prompt"] == text["prompt"] and "images" not in item


def _group(path, extra=()):
    cfg, plan = engine_config(path, extra=["algorithm=reinforce_pp", "rollout.n=1", "data.max_response_length=6",
                                           "actor.micro_batch_size_seqs_per_worker=4", *extra])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(path, with_ref=False)
    return group


def test_rollout_log_probs_on_image_prompts_are_the_trainers_packed_and_padded(tmp_path, vl_path):
    group = _group(vl_path)
    try:
        engine = group.worker.actor
        assert engine.vision and engine.pack_sequences  # the start-up check: packed rows score as padded ones
        assert engine.chunked_head  # log-probs from the last hidden states in chunks, without [tokens, V] logits
        torch.manual_seed(0)
        out = group.generate_sequences(vl_prompts(tmp_path, vl_path))
        image_ids = torch.tensor([engine.model.config.image_token_id, engine.model.config.vision_start_token_id])
        assert not torch.isin(out.tensors["responses"], image_ids).any()  # never sampled
        mask = out.tensors["response_mask"].bool()
        packed = engine.forward(out).log_probs
        engine.pack_sequences = False
        padded = engine.forward(out).log_probs
        engine.pack_sequences = True
        rollout = out.tensors["rollout_log_probs"]
        assert (packed - rollout)[mask].abs().max() < 1e-5 and (padded - rollout)[mask].abs().max() < 1e-5
        # the positions are 3-D: an image's tokens share a time and rows follow its grid, and the text after it
        # continues from the image's largest position, not from its token count
        positions = rope_positions(engine.model, out.tensors["input_ids"], out.tensors["attention_mask"],
                                   out.non_tensors[MULTI_MODAL], out.tensors["prompts"].shape[1])
        real = out.tensors["attention_mask"][0].bool()
        first = positions[0][real]
        assert first[-1, 0] < real.sum() - 1 and torch.equal(first[-1], first[-1, :1].expand(3))
        # each row's images go with it: swapping two rows' images changes both rows' log-probs
        swapped = out.non_tensors[MULTI_MODAL].copy()
        swapped[0], swapped[3] = swapped[3], swapped[0]
        other = engine.forward(Batch.from_dict(out.tensors, non_tensors={**out.non_tensors, MULTI_MODAL: swapped}))
        changed = (other.log_probs - packed).abs().amax(-1)
        assert changed[0] > 1e-3 and changed[3] > 1e-3 and changed[1] < 1e-5 and changed[2] < 1e-5
        # micro-batches of 3 + 1 rows, and of a token budget, take each row's images with it
        for split in (MicroBatching(3), MicroBatching(4, max_tokens=80)):
            assert len(micro_batches(engine, out, split)) == 2
            pieces = engine.infer(out, split=split)["log_probs"]
            assert (pieces - rollout)[mask].abs().max() < 1e-5, split
    finally:
        group.shutdown()


def test_an_update_between_two_tokens_recomputes_image_prompts_under_the_new_weights(tmp_path, vl_path):
    """rollout.partial=resume on image prompts: the rows still sampling when an update arrives go on under the new
    weights, their cache (images, 3-D positions, tokens so far) computed again; every later token's log-prob is
    the new model's, as the trainer scores it."""
    from rlplat.rollout.base import SamplingParams, UpdateSlot

    group = _group(vl_path)
    try:
        engine, rollout = group.worker.actor, group.worker.rollout
        rollout.batch_size_seqs = 2  # the update arrives during the first chunk: rows 0 and 1
        torch.manual_seed(0)
        new = [(name, t + 0.05 * torch.randn_like(t)) for name, t in engine.model.state_dict().items()
               if name not in engine.frozen_names]
        rollout.updates = UpdateSlot()
        rollout.updates.offer(lambda: rollout.load_weights([new]))
        out = rollout.generate(vl_prompts(tmp_path, vl_path), SamplingParams(max_new_tokens=6, temperature=1.0,
                                                                             ignore_eos=True))
        assert out.tensors["weight_updates"].tolist() == [1, 1, 0, 0]
        scored = engine.forward(out).log_probs  # the new weights (the rollout shares the actor's tensors)
        gap = (scored - out.tensors["rollout_log_probs"]).abs()
        assert gap[:2, 1:].max() < 1e-5 and gap[2:].max() < 1e-5  # all but the first chunk's first tokens: new
        assert gap[:2, 0].min() > 1e-4  # those the old weights sampled
    finally:
        group.shutdown()


def test_the_frozen_vision_tower_is_not_trained_or_synced(tmp_path, vl_path):
    group = _group(vl_path)
    try:
        engine = group.worker.actor
        vision = {n: p.detach().clone() for n, p in engine.model.named_parameters() if n in engine.frozen_names}
        language = {n: p.detach().clone() for n, p in engine.model.named_parameters() if n not in engine.frozen_names}
        assert vision and all(".visual." in f".{n}" for n in vision)
        torch.manual_seed(0)
        batch = with_training_fields(group.generate_sequences(vl_prompts(tmp_path, vl_path)))
        group.update_actor(batch.union(Batch.from_dict({"old_log_probs": batch.tensors["rollout_log_probs"]})))
        params = dict(engine.model.named_parameters())
        assert all(torch.equal(params[n], v) for n, v in vision.items())  # bit-identical after a step
        assert any(not torch.equal(params[n], v) for n, v in language.items())
        sent = {name: t for bucket in group.worker.weights.outgoing(engine) for name, t in bucket}
        assert set(sent) == set(engine.model.state_dict()) - engine.frozen_names  # (the tied head counts once)
        # a checkpoint of the partly frozen model resumes exactly: a second step from it is the same step
        group.save_checkpoint(str(tmp_path / "ckpt"))
        resumed = _group(vl_path)
        try:
            resumed.load_checkpoint(str(tmp_path / "ckpt"))
            for each in (group, resumed):
                each.update_actor(batch.union(Batch.from_dict({"old_log_probs": batch.tensors["rollout_log_probs"]})))
            after = dict(resumed.worker.actor.model.named_parameters())
            assert all(torch.equal(after[n], p) for n, p in engine.model.named_parameters())
        finally:
            resumed.shutdown()
    finally:
        group.shutdown()
    trained = _group(vl_path, ["actor.vision.freeze=false"])
    try:
        assert not trained.worker.actor.frozen_names
    finally:
        trained.shutdown()


@pytest.mark.parametrize("override, expected", [
    ("actor.fsdp.ulysses_size=2", "Ulysses sequence parallelism does not split an image's tokens"),
    ("rollout.hf.use_model_generation_config=true", "engine does not generate from images"),
    ("rollout.agent.name=tool", "agent loop's conversations do not carry images"),
    ("model.lora.rank=4", "LoRA does not tell the vision tower's layers"),
    ("algorithm=ppo", "algorithm.adv_estimator=gae needs a critic"),
    ("actor.strategy=megatron", "actor.strategy=megatron: .* is a vision-language model, which this engine does not"),
])
def test_what_a_vision_language_model_does_not_run_with_is_refused_at_start_up(vl_path, override, expected):
    from rlplat.trainer.run import load_run_config

    workers = ["trainer.workers_per_node=2"] if "ulysses" in override else ["trainer.ray_address=inprocess"]
    with pytest.raises(ConfigError, match=expected):
        load_run_config([f"model.path={vl_path}", override, *workers], require_installed=False)


@pytest.mark.parametrize("override, expected", [
    ("algorithm=ppo", "is a vision-language model: algorithm.adv_estimator=gae needs a critic"),
    ("actor.strategy=megatron", "actor.strategy=megatron: .* is a vision-language model, which this engine does not"),
])
def test_a_hub_vision_language_model_is_checked_once_its_config_is_fetched(vl_path, tmp_path, monkeypatch, override,
                                                                           expected):
    """A hub id's config is not known at start-up (offline, not cached: planned as a text model); once preflight
    has fetched it (here the hub answers with the tiny model's config), the run is planned again and refused."""
    from transformers import AutoConfig

    from rlplat.trainer.preflight import preflight
    from rlplat.trainer.run import load_run_config

    hub = "Qwen/Qwen2.5-VL-7B-Instruct"
    cfg, plan = load_run_config([f"model.path={hub}", override, "trainer.ray_address=inprocess",
                                 f"trainer.output_dir={tmp_path}"], require_installed=False)
    fetch = AutoConfig.from_pretrained
    monkeypatch.setattr(AutoConfig, "from_pretrained",
                        lambda path, **kwargs: fetch(vl_path if path == hub else path, **kwargs))
    with pytest.raises(ConfigError, match=expected):
        preflight(cfg, plan)
