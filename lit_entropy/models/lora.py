"""LoRA adapters on the policy (``model.policy.lora``), with ``peft`` as an optional dependency.

The adapters are injected *into* the Hugging Face model (``peft.inject_adapter_in_model``): the policy stays a
``*ForCausalLM`` (its forward, ``generate``, hidden states, FSDP2 sharding and state-dict names work as for full
fine-tuning), its projections gain ``base_layer`` / ``lora_A`` / ``lora_B`` sub-modules and only the adapter
weights require grad. The rest of the library reaches the adapters through this module only:

* :func:`adapters_disabled` turns the policy back into its base model (the KL term's reference, no second copy);
* :func:`merged_weights` streams ``W + alpha / r * B @ A`` under the plain Hugging Face names (vLLM's weight push,
  ``lit-entropy export --merge``);
* :func:`adapter_state_dict` / :func:`save_adapter` write the adapters in peft's directory format;
* :func:`is_frozen_base_key` says which state-dict entries checkpoints leave out (the frozen base, reloaded from
  ``model.policy.model_name_or_path``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from safetensors.torch import save_file
from torch import Tensor, nn

if TYPE_CHECKING:  # peft is optional (the lora extra); only the annotations need it here
    from peft.tuners.tuners_utils import BaseTunerLayer

__all__ = [
    "ADAPTER_NAME",
    "PEFT_MISSING",
    "adapter_state_dict",
    "adapters_disabled",
    "apply_lora",
    "has_lora",
    "is_frozen_base_key",
    "lora_scalings",
    "merged_weights",
    "require_peft",
    "save_adapter",
    "trainable_count",
]

ADAPTER_NAME = "default"
"""peft's name of the (single) adapter; it appears in state-dict keys as ``lora_A.default.weight``."""
PEFT_MISSING = (
    "model.policy.lora needs peft, which is not installed: pip install 'lit-entropy[lora]' (or: pip install peft)"
)
_LORA_PARTS = (".base_layer.", f".lora_A.{ADAPTER_NAME}.", f".lora_B.{ADAPTER_NAME}.")


def require_peft() -> Any:
    """The ``peft`` module.

    Raises:
        ImportError: one line naming the setting and the install command, when peft is missing.
    """
    try:
        # optional dependency (the lora extra): imported only once LoRA is on
        import peft
    except ImportError:
        raise ImportError(PEFT_MISSING) from None
    return peft


def apply_lora(model: nn.Module, r: int, alpha: float, dropout: float, target_modules: list[str] | None) -> nn.Module:
    """Inject LoRA adapters into ``model`` in place and freeze everything else; returns ``model``.

    Args:
        model: a Hugging Face causal LM.
        r, alpha, dropout: adapter rank, scaling numerator (the update is ``alpha / r * B @ A``), input dropout.
        target_modules: module-name suffixes to adapt; None = peft's ``all-linear`` (every linear layer of the
            decoder blocks, not the LM head: the attention and MLP projections).

    Raises:
        ValueError: when a target is not a linear layer (only linear adapters are merged for vLLM and export).
    """
    peft = require_peft()
    # optional dependency (the lora extra): imported only once LoRA is on
    from peft.tuners.lora import Linear as LoraLinear

    config = peft.LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules or "all-linear", bias="none"
    )
    try:
        model = peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    except ValueError as error:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"model.policy.lora.target_modules={target_modules!r}: {error}") from None
    others = sorted({type(m).__name__ for m in _lora_layers(model) if not isinstance(m, LoraLinear)})
    if others:
        raise ValueError(
            f"model.policy.lora.target_modules={target_modules!r} adapts non-linear layers ({', '.join(others)}); "
            "only linear layers are supported (name the attention / MLP projections)"
        )
    return model


def _lora_layers(model: nn.Module) -> list[BaseTunerLayer]:
    # optional dependency (the lora extra): imported only once LoRA is on
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def has_lora(model: nn.Module | None) -> bool:
    """Whether ``model`` carries LoRA adapters (injected by :func:`apply_lora`)."""
    return model is not None and any("lora_A." in name for name, _ in model.named_parameters())


def is_frozen_base_key(key: str) -> bool:
    """Whether a state-dict key of an adapted policy belongs to the frozen base (not an adapter weight)."""
    return ".lora_A." not in key and ".lora_B." not in key


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Within the block ``model`` computes its base model's outputs (the adapters are bypassed, not removed)."""
    layers = _lora_layers(model)
    trainable = [(p, p.requires_grad) for p in model.parameters()]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for param, flag in trainable:  # peft's toggle also flips requires_grad; restore exactly what was there
            param.requires_grad_(flag)


def lora_scalings(model: nn.Module, rename: Callable[[str], str] = lambda name: name) -> dict[str, float]:
    """``{module name: alpha / r}`` of every adapted layer, names passed through ``rename``."""
    return {
        rename(name): float(m.scaling[ADAPTER_NAME])
        for name, m in model.named_modules()
        if isinstance(getattr(m, "scaling", None), dict)  # attention modules have a float ``scaling`` of their own
    }


def _split(name: str) -> tuple[str, str, str] | None:
    """``("x.q_proj", part, "weight")`` for ``x.q_proj.<part>weight`` with part one of :data:`_LORA_PARTS`."""
    for part in _LORA_PARTS:
        if part in name:
            module, leaf = name.split(part, 1)
            return module, part, leaf
    return None


def merged_weights(
    items: Iterable[tuple[str, Tensor]], scalings: dict[str, float], full: Callable[[Tensor], Tensor] = lambda t: t
) -> Iterator[tuple[str, Tensor]]:
    """The ``(name, tensor)`` stream of an adapted model's state dict with the adapters merged into the base.

    ``x.base_layer.weight`` + ``x.lora_A.default.weight`` + ``x.lora_B.default.weight`` become one ``x.weight =
    W + scaling * B @ A`` (computed in float32, returned in W's dtype); ``x.base_layer.bias`` becomes ``x.bias``;
    other entries pass unchanged. Only the three tensors of one layer are held at a time.

    Args:
        items: ``(name, tensor)`` in state-dict order (a layer's base weight before its adapters).
        scalings: :func:`lora_scalings` under the same names.
        full: materialises one tensor (an FSDP2 ``DTensor``'s ``full_tensor``); called once per adapter tensor.
    """
    pending: dict[str, dict[str, Tensor]] = {}
    for name, tensor in items:
        parts = _split(name)
        if parts is None or parts[0] not in scalings:
            yield name, tensor
            continue
        module, part, leaf = parts
        if leaf != "weight":  # the base layer's bias
            yield f"{module}.{leaf}", full(tensor)
            continue
        layer = pending.setdefault(module, {})
        layer[part] = full(tensor)
        if len(layer) == len(_LORA_PARTS):
            del pending[module]
            base, a, b = (layer[p] for p in _LORA_PARTS)
            delta = (b.float() @ a.float()) * scalings[module]
            yield f"{module}.weight", (base.float() + delta).to(base.dtype)
    if pending:
        raise ValueError(f"incomplete LoRA layers in the state dict: {sorted(pending)}")


def adapter_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The adapter weights of an adapted model's state dict under peft's saved names.

    ``model.layers.0.self_attn.q_proj.lora_A.default.weight`` -> ``base_model.model.model.layers.0.self_attn.
    q_proj.lora_A.weight`` (what ``PeftModel.save_pretrained`` writes and ``PeftModel.from_pretrained`` reads).
    """
    out = {}
    for key, value in state.items():
        if not is_frozen_base_key(key):
            out["base_model.model." + key.replace(f".{ADAPTER_NAME}.", ".")] = value.detach().cpu().contiguous()
    return out


def save_adapter(model: nn.Module, state: dict[str, Tensor], path: Path, base_model: str) -> None:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (peft's format) into the directory ``path``.

    Args:
        model: the adapted model (its peft config is read).
        state: its full state dict (gathered under FSDP2).
        path: an existing directory.
        base_model: recorded as ``base_model_name_or_path`` (what the adapter was trained on).
    """
    # peft's inject_adapter_in_model sets ``peft_config`` on the model: an attribute nn.Module's typing cannot know.
    config = cast(dict[str, Any], model.__dict__["peft_config"])[ADAPTER_NAME]
    saved = config.to_dict()
    saved.update(base_model_name_or_path=base_model, task_type="CAUSAL_LM", inference_mode=True)
    saved = {k: sorted(v) if isinstance(v, set) else v for k, v in saved.items()}
    (path / "adapter_config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    save_file(adapter_state_dict(state), str(path / "adapter_model.safetensors"), metadata={"format": "pt"})


def trainable_count(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts of ``model``."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
