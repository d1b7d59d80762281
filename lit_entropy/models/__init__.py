"""The models of a run: loading (policy, frozen reference, critic), local model paths, hidden states for the
vocabulary pass, export as a ``save_pretrained`` directory, and tiny Qwen2 builders."""

from lit_entropy.models.export import (
    check_export_target,
    default_export_dir,
    export_hf_model,
    export_policy,
    is_export,
)
from lit_entropy.models.hidden_states import forward_with_positions, lm_head_params, response_hidden_states
from lit_entropy.models.loading import RFTModels, check_context_length, load_causal_lm, load_rft_models, load_tokenizer
from lit_entropy.models.paths import MODEL_PATH_SETTING, check_model_dir, is_lfs_pointer
from lit_entropy.models.tiny import build_qwen2, save_tiny_model

__all__ = [
    "MODEL_PATH_SETTING",
    "RFTModels",
    "build_qwen2",
    "check_context_length",
    "check_export_target",
    "check_model_dir",
    "export_hf_model",
    "default_export_dir",
    "export_policy",
    "forward_with_positions",
    "is_export",
    "is_lfs_pointer",
    "lm_head_params",
    "load_causal_lm",
    "load_rft_models",
    "load_tokenizer",
    "response_hidden_states",
    "save_tiny_model",
]
