"""Options shared by several commands (model, layout, batch, run directory)."""

from __future__ import annotations

import click


class IntList(click.ParamType):
    """Comma- or space-separated positive integers: "1,8,32"."""

    name = "ints"

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        out = []
        for tok in str(value).replace(",", " ").split():
            try:
                v = int(tok)
            except ValueError:
                self.fail(f"{tok!r} is not an integer (expected e.g. 1,8,32)", param, ctx)
            if v < 1:
                self.fail(f"{v} is not positive (expected integers >= 1)", param, ctx)
            out.append(v)
        if not out:
            self.fail("no value given (expected e.g. 1,8,32)", param, ctx)
        return out


def _positive(ctx, param, value):
    if value is not None and value < 1:
        raise click.BadParameter(f"{value} is not positive (expected an integer >= 1)")
    return value


def model_option(f):
    return click.option(
        "--model",
        "-m",
        required=True,
        metavar="MODEL",
        help="config.json path, a model folder holding one, an org/name model id in the local Hugging Face "
        "cache, or a preset (kimi-k2.5, kimi-k2.5-nvfp4, deepseek-v3, deepseek-r1, llama-3.1-70b, qwen3-32b, "
        "qwen3-235b-a22b, mixtral-8x7b, glm-4.5-air, qwen2.5-72b, qwen2.5-32b, qwen2-72b, qwen2-57b-a14b, "
        "qwen3.5-397b-a17b, gemma-3-27b, gpt-oss-120b, mistral-small-24b).",
    )(f)


def layout_options(f):
    for opt in reversed(
        [
            click.option(
                "--tp", type=int, default=1, show_default=True, callback=_positive, help="Tensor-parallel size."
            ),
            click.option(
                "--ep", is_flag=True, help="Expert parallelism on (vLLM --enable-expert-parallel; EP size = dp x tp)."
            ),
            click.option(
                "--dp",
                type=int,
                default=1,
                show_default=True,
                callback=_positive,
                help="Data-parallel size (attention).",
            ),
            click.option(
                "--pp", type=int, default=1, show_default=True, callback=_positive, help="Pipeline-parallel stages."
            ),
            click.option(
                "--dcp",
                type=int,
                default=1,
                show_default=True,
                callback=_positive,
                help="Decode-context-parallel size (MLA; divides tp).",
            ),
        ]
    ):
        f = opt(f)
    return f


def batch_option(f):
    return click.option(
        "--batch",
        "-b",
        type=IntList(),
        multiple=False,
        default="1",
        show_default=True,
        help="Decode batch size(s), sequences per step: 1 or 1,8,32.",
    )(f)


def out_option(f):
    return click.option(
        "--out",
        "-o",
        type=click.Path(file_okay=False),
        default=None,
        help="Run directory to write into (created if missing).",
    )(f)
