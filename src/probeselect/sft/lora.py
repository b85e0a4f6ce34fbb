"""LoRA target modules for any HF causal LM.

``method.target_modules`` is ``all-linear`` (the default: every ``nn.Linear`` and GPT-2-style
``Conv1D`` layer of the attention and MLP blocks, the output head excluded, as peft's
``"all-linear"``) or a list of module names (``[q_proj, v_proj]`` on Llama, ``[c_attn]`` on
GPT-2, ``[query_key_value]`` on GPT-NeoX). A name matches a module whose dotted name is that
name or ends with ``.<name>`` (peft's rule); a name that matches nothing is an error that
lists the linear layers the model has. ``fan_in_fan_out`` is set from the layer type: True
for ``Conv1D`` (weights stored as ``[in, out]``, GPT-2), False for ``nn.Linear``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import RecipeError

ALL_LINEAR = "all-linear"


def _conv1d_type():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - every supported transformers has it
        return ()
    return (Conv1D,)


def linear_layers(model) -> dict[str, str]:
    """``{dotted module name: "linear" | "conv1d"}`` for the linear layers LoRA can adapt:
    every ``nn.Linear`` / ``Conv1D`` except the output head (``get_output_embeddings()``)."""
    conv = _conv1d_type()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out = {}
    for name, mod in model.named_modules():
        if mod is head or name.split(".")[-1] in ("lm_head", "embed_out"):
            continue
        if isinstance(mod, torch.nn.Linear):
            out[name] = "linear"
        elif conv and isinstance(mod, conv):
            out[name] = "conv1d"
    return out


def _matches(name: str, key: str) -> bool:
    return name == key or name.endswith("." + key)


def resolve_target_modules(model, target_modules, *, source: str, base) -> tuple[list[str], bool]:
    """The module names to adapt and ``fan_in_fan_out`` for ``model``.

    ``target_modules``: ``"all-linear"`` or a list of names. Returns the sorted distinct leaf
    names (``["c_attn", "c_fc", "c_proj"]`` on GPT-2). Raises RecipeError, naming the recipe
    and the model folder, when a name matches no linear layer or the targets mix ``Linear``
    and ``Conv1D`` layers (peft's ``fan_in_fan_out`` is one setting for all of them).
    """
    layers = linear_layers(model)
    leaves = sorted({n.split(".")[-1] for n in layers})
    if not layers:
        raise RecipeError(f"{source}: the model at {base} has no nn.Linear or Conv1D layers for LoRA; use "
                          "method: {type: full}.")
    if target_modules == ALL_LINEAR or list(target_modules) == [ALL_LINEAR]:
        chosen = dict(layers)
        names = leaves
    else:
        names = list(target_modules)
        bad = [k for k in names if not any(_matches(n, k) for n in layers)]
        if bad:
            other = [k for k in bad if any(_matches(n, k) for n, _ in model.named_modules())]
            why = (f" ({', '.join(other)} exist but are not linear layers)" if other else "")
            raise RecipeError(
                f"{source}: method.target_modules {bad} match no linear layer of the model at {base} "
                f"({type(model).__name__}){why}. Its linear layers are: {', '.join(leaves)}; use some of "
                f"these, or `target_modules: {ALL_LINEAR}` (the default) for all of them.")
        chosen = {n: t for n, t in layers.items() if any(_matches(n, k) for k in names)}
    kinds = set(chosen.values())
    if len(kinds) > 1:
        conv = sorted({n.split(".")[-1] for n, t in chosen.items() if t == "conv1d"})
        lin = sorted({n.split(".")[-1] for n, t in chosen.items() if t == "linear"})
        raise RecipeError(f"{source}: method.target_modules mix Conv1D layers ({', '.join(conv)}) and nn.Linear "
                          f"layers ({', '.join(lin)}) of the model at {base}; peft stores them differently "
                          "(fan_in_fan_out), so list one kind only.")
    return names, kinds == {"conv1d"}


def lora_config(model, method, *, source: str, base: str | Path):
    """A peft ``LoraConfig`` for ``model`` from a recipe's ``method`` section."""
    from peft import LoraConfig

    names, fan_in_fan_out = resolve_target_modules(model, method.target_modules, source=source, base=base)
    return LoraConfig(r=method.r, lora_alpha=method.alpha, lora_dropout=method.dropout, target_modules=names,
                      fan_in_fan_out=fan_in_fan_out, bias="none", task_type="CAUSAL_LM")
