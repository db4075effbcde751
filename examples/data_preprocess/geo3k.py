"""Geometry3K (hiyouga/geometry3k) -> rlplat parquet with images, for a vision-language model.

    python examples/data_preprocess/geo3k.py --out-dir data/geo3k                    # from the hub
    python examples/data_preprocess/geo3k.py --train-file train.parquet --test-file test.parquet

Original rows: ``{"images": [image], "problem": "<image>Find x.", "answer": "3"}`` (the images as Hugging Face
``datasets`` stores them: ``{"bytes", "path"}`` in parquet, a PIL image when read from the hub). Rows keep the
images (as ``{"bytes", "path"}``: PNG bytes) and the ``<image>`` placeholder in the prompt (verl's multimodal
form, docs/vision.md), ask for the final answer in ``\\boxed{}`` and get ``data_source: hiyouga/geometry3k``,
scored by rlplat's ``math_boxed`` reward.
"""

import io
import sys

from preprocess_common import PreprocessError, column, parser, rlhf_row, run

INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
               "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
               "BE put in \\boxed{}.")


def image_entry(image, where: str) -> dict:
    """One image as ``{"bytes", "path"}``: a stored image's bytes, a file path, or a PIL image (hub) as PNG."""
    if isinstance(image, dict) and (image.get("bytes") or image.get("path")):
        return {"bytes": image.get("bytes"), "path": image.get("path")}
    if isinstance(image, (bytes, str)):
        return {"bytes": image, "path": None} if isinstance(image, bytes) else {"bytes": None, "path": image}
    if hasattr(image, "save"):  # a PIL image
        out = io.BytesIO()
        image.save(out, format="PNG")
        return {"bytes": out.getvalue(), "path": None}
    raise PreprocessError(f"{where}: column 'images' holds a {type(image).__name__}; expected an image")


def to_row(row: dict, where: str, split: str, index: int) -> dict:
    images = column(row, "images", where)
    images = list(images) if not isinstance(images, (dict, bytes, str)) else [images]
    problem = str(column(row, "problem", where))
    if problem.count("<image>") != len(images):
        raise PreprocessError(f"{where}: column 'problem' has {problem.count('<image>')} <image> placeholder(s) for "
                              f"{len(images)} image(s)")
    out = rlhf_row("hiyouga/geometry3k", f"{problem} {INSTRUCTION}", str(column(row, "answer", where)), split, index,
                   ability="math", problem=problem)
    return {**out, "images": [image_entry(image, where) for image in images]}


if __name__ == "__main__":
    args = parser(__doc__.splitlines()[0], "hiyouga/geometry3k", "data/geo3k").parse_args()
    sys.exit(run(args, to_row))
