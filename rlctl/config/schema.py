"""The typed, frozen config of rlctl.toml: the only place defaults live.

Sections are dataclasses; a nested section (`model.lora`) is a dataclass-typed field. Each field
carries its help text and bounds in `metadata`, which the loader (validation), `config schema`
(JSON schema) and the docs read. Nothing else in rlctl calls `cfg.get(key, default)`.

Batch-size units follow verl: `data.batch_size` and `actor.mini_batch_size` count prompts;
`actor.micro_batch_size` counts sequences per worker per forward/backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

from rlctl.config.algorithm_tables import DynamicSamplingConfig, PfPpoConfig, RolloutCorrectionConfig
from rlctl.config.rollout_tables import (AGENT_REWARDS, BUILTIN_TOOLS, TOOL_FORMATS,  # noqa: F401 (re-exported)
                                        AgentConfig, MultiTurnConfig)
from rlctl.config.fields import opt
from rlctl.config.names import (ADV_ESTIMATORS, JUDGE_PROMPT, KL_TYPES, LOGGERS, LOSS_AGG_MODES,
                                POLICY_LOSSES, REWARD_SOURCES)


@dataclass(frozen=True)
class RunConfig:
    kind: str = opt("rl", "What the run trains: \"rl\" (rollouts, rewards, an RL algorithm) or \"sft\" "
                          "(supervised fine-tuning on prompt/response or chat data; see [sft]).", choices=("rl", "sft"))
    name: str = opt("run", "Run name; the run folder is <output_dir>/<name>.")
    output_dir: str = opt("runs", "Folder that holds run folders (relative to the config file).", path=True)
    seed: int = opt(42, "Seed for data order, sampling and initialisation.", ge=0)
    total_steps: int = opt(0, "Training steps; 0 means total_epochs x steps per epoch.", ge=0)
    total_epochs: int = opt(1, "Epochs over the training data when total_steps is 0.", ge=1)
    save_every: int = opt(0, "Checkpoint every N steps (0 = only at the end and on interrupt).", ge=0)
    keep_last: int = opt(2, "Checkpoints to keep (0 = keep all).", ge=0)
    val_every: int = opt(0, "Validate every N steps (0 = only at the end).", ge=0)
    val_before_train: bool = opt(False, "Validate once before the first step.")
    best_metric: str = opt("", "Validation metric that picks the best checkpoint, e.g. \"val/reward/mean\" or "
                               "\"val/acc\" (\"\" = off); a validation step that improves it is saved and kept.")
    best_mode: str = opt("max", "Whether a higher (max) or lower (min) best_metric is better.", choices=("max", "min"))
    loggers: tuple = opt(("console", "jsonl"), "Metric sinks.", choices=LOGGERS)
    log_samples: int = opt(4, "Prompt/response pairs written to samples.jsonl per step.", ge=0)
    log_rollouts: bool = opt(False, "Write every sample of every step (prompt_ids, response_ids, response_mask, "
                                    "messages, score) to rollouts/step_<N>.jsonl in the run folder.")
    max_restarts: int = opt(0, "Times a run restarts its workers by itself after one dies or fails (the exit-4 "
                               "class), continuing from the newest valid checkpoint in the same command "
                               "(0 = stop with exit 4).", ge=0)
    restart_backoff_s: float = opt(10.0, "Seconds to wait after the workers were torn down before they start "
                                         "again (run.max_restarts).", ge=0)


@dataclass(frozen=True)
class LoraConfig:
    rank: int = opt(0, "LoRA rank; 0 means full fine-tuning.", ge=0, le=4096)
    alpha: float = opt(16.0, "LoRA alpha (scaling = alpha / rank).", gt=0)
    dropout: float = opt(0.0, "LoRA dropout.", ge=0, lt=1)
    target_modules: tuple = opt(("all-linear",), "Layers that get adapters: [\"all-linear\"] (every linear layer of "
                                "the decoder, MoE experts included, not the output head) or layer names, each of "
                                "which must match a layer of the model (e.g. [\"q_proj\", \"v_proj\"]).")
    sync: str = opt("merged", "What reaches a rollout engine with its own weights (vLLM) after each update: "
                              "\"merged\" (the full merged weights) or \"adapter\" (the LoRA tensors only, one "
                              "adapter name per policy version: ~4% of the bytes, but unmerged LoRA decodes slower). "
                              "Where the adapter cannot carry the update, validate says so and the run uses merged "
                              "(docs/lora.md).",
                    choices=("adapter", "merged"))


@dataclass(frozen=True)
class ModelConfig:
    path: str = opt("", "Local model folder or Hugging Face model id (offline: it must be in the Hugging Face "
                        "cache).", required=True)
    dtype: str = opt("auto", "Training dtype; auto = bfloat16 on GPU, float32 on CPU.",
                     choices=("auto", "float32", "bfloat16", "float16"))
    gradient_checkpointing: bool = opt(False, "Recompute activations in backward to save memory.")
    trust_remote_code: bool = opt(False, "Allow model code from the hub (runs that code).")
    freeze_vision_tower: bool = opt(False, "Vision-language models: train the language model only; the vision "
                                           "tower (and its merger) keeps its weights.")
    chat_template: str = opt("", "A Jinja chat template file (relative to rlctl.toml, or one rlctl ships: "
                                 "smollm2-tools.jinja) rendering every chat instead of the model's own: training, "
                                 "rollout, eval; `rlctl merge` saves it with the tokenizer.", path=True)
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA adapters."})


@dataclass(frozen=True)
class DataConfig:
    train_files: tuple = opt((), "Training parquet files (verl schema).", required=True, path=True)
    val_files: tuple = opt((), "Validation parquet files.", path=True)
    max_prompt_length: int = opt(512, "Longest prompt in tokens after the chat template.", ge=1)
    max_response_length: int = opt(512, "Longest generated response in tokens.", ge=1)
    batch_size: int = opt(8, "Prompts per training step.", ge=1)
    overlong_prompts: str = opt("filter", "What to do with prompts over max_prompt_length.",
                                choices=("filter", "error", "truncate"))
    shuffle: bool = opt(True, "Shuffle the training data every epoch (seeded).")
    val_batch_size: int = opt(64, "Prompts per validation generation batch.", ge=1)
    image_key: str = opt("images", "Vision-language data: the column holding each row's images (one `<image>` "
                                   "marker per image in the prompt), as verl's data.image_key.")


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str = opt("grpo", "Advantage estimator (built-ins, or one registered by a plugin).", choices=ADV_ESTIMATORS,
                    extensible=True)
    plugins: tuple = opt((), "Python files (relative to rlctl.toml) that register your own estimators and policy "
                             "losses; imported by the controller and every actor worker.", path=True)
    gamma: float = opt(1.0, "Discount factor.", ge=0, le=1)
    lam: float = opt(1.0, "GAE lambda.", ge=0, le=1)
    norm_adv_by_std: bool = opt(True, "GRPO: divide by the group std (False = Dr. GRPO).")
    kl_in_reward: bool = opt(False, "Subtract kl_coef x KL(actor || ref) from token rewards.")
    kl_coef: float = opt(0.001, "KL-in-reward coefficient (initial value when adaptive).", ge=0)
    kl_type: str = opt("kl", "KL estimator for the in-reward penalty.", choices=KL_TYPES)
    kl_ctrl: str = opt("fixed", "KL-in-reward coefficient controller.", choices=("fixed", "adaptive"))
    kl_target: float = opt(0.1, "Adaptive controller: target KL.", gt=0)
    kl_horizon: int = opt(10000, "Adaptive controller: horizon in samples.", ge=1)
    ref_update_every: int = opt(0, "Copy the policy into the reference model every this many steps (0 = never): "
                                   "SPIN's iterations, the reference being the opponent (verl's ref_update_freq).",
                                ge=0)
    params: dict = opt({}, "The estimator's own parameters, e.g. dpo_beta = 0.1 (spin), checked against its "
                           "declaration (docs/algorithms.md lists each one's).", table=True)
    use_pf_ppo: bool = opt(False, "PF-PPO: resample each prompt's samples by their scores (docs/algorithms.md).")
    pf_ppo: PfPpoConfig = field(default_factory=PfPpoConfig, metadata={"help": "PF-PPO (verl's names)."})
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig,
                                                    metadata={"help": "DAPO dynamic sampling."})
    rollout_correction: RolloutCorrectionConfig = field(
        default_factory=RolloutCorrectionConfig,
        metadata={"help": "Correct for a rollout policy that differs from the trained one (verl's names)."})


@dataclass(frozen=True)
class ActorConfig:
    lr: float = opt(1e-6, "Learning rate.", gt=0, le=1)
    warmup_steps: int = opt(0, "Linear warm-up steps.", ge=0)
    lr_schedule: str = opt("constant", "LR schedule after warm-up.", choices=("constant", "cosine"))
    min_lr_ratio: float = opt(0.0, "Cosine floor as a fraction of lr.", ge=0, le=1)
    weight_decay: float = opt(0.01, "AdamW weight decay.", ge=0)
    grad_clip: float = opt(1.0, "Clip the global gradient norm (0 = off).", ge=0)
    optimizer_state_dtype: str = opt("float32", "AdamW's two moments: float32, or bfloat16 (half their memory; "
                                                "float32 masters and updates, the second moment rounded "
                                                "stochastically; docs/performance.md#optimizer-state-in-bfloat16).",
                                     choices=("float32", "bfloat16"))
    ppo_epochs: int = opt(1, "Passes over each rollout batch.", ge=1)
    mini_batch_size: int = opt(0, "Prompts per optimizer step (0 = data.batch_size, one step per rollout).", ge=0)
    micro_batch_size: int = opt(4, "Sequences per worker per forward/backward (gradient accumulation).", ge=1)
    micro_batch_max_tokens: int = opt(0, "Token budget of one micro-batch per worker in the update, old-log-prob and "
                                         "reference passes (docs/performance.md#token-budget-micro-batches); each "
                                         "step's rows are spread so the workers' tokens balance. 0 = "
                                         "micro_batch_size rows each. verl's ppo_max_token_len_per_gpu.", ge=0)
    ulysses_sequence_parallel_size: int = opt(1, "Ranks that split each sequence (1 = off; docs/parallelism.md).", ge=1)
    policy_loss: str = opt("vanilla", "Policy loss (built-ins, or one registered by a plugin).",
                           choices=POLICY_LOSSES, extensible=True)
    clip_ratio_low: float = opt(0.2, "PPO clip below 1 (ratio >= 1 - low); < 1 except for a loss whose ratio only "
                                      "weights (cispo: >= 1 = no lower bound).", ge=0)
    clip_ratio_high: float = opt(0.2, "PPO clip above 1 (ratio <= 1 + high); DAPO clip-higher uses 0.28.", ge=0)
    clip_ratio_c: float = opt(3.0, "Dual-clip bound for negative advantages (> 1).", gt=1)
    loss_agg_mode: str = opt("token-mean", "How token losses are aggregated.", choices=LOSS_AGG_MODES)
    loss_params: dict = opt({}, "The policy loss's own parameters, e.g. tau_pos = 1.0 (sapo), checked against its "
                                "declaration (docs/algorithms.md lists each one's).", table=True)
    entropy_coef: float = opt(0.0, "Entropy bonus coefficient.", ge=0)
    use_kl_loss: bool = opt(False, "Add kl_loss_coef x KL(actor || ref) to the loss (GRPO).")
    kl_loss_coef: float = opt(0.001, "KL-loss coefficient.", ge=0)
    kl_loss_type: str = opt("low_var_kl", "KL estimator for the KL loss.", choices=KL_TYPES)
    expert_parallel_size: int = opt(1, "MoE policies: ranks each layer's experts are split over (1 = off).", ge=1)
    router_replay: bool = opt(False, "MoE policies: the update routes each response token through the experts the "
                                     "log-prob pass chose (docs/runtime.md#router-replay).")
    moe_aux_loss_coef: float = opt(-1.0, "MoE policies: weight of the router's load-balancing loss in the update "
                                         "(transformers' aux_loss); -1 = the model's router_aux_loss_coef, 0 = off.",
                                   ge=-1)


@dataclass(frozen=True)
class CriticConfig:
    model_path: str = opt("", "Critic model (empty = model.path); a value head is added.")
    lr: float = opt(1e-5, "Learning rate.", gt=0, le=1)
    warmup_steps: int = opt(0, "Linear warm-up steps.", ge=0)
    weight_decay: float = opt(0.01, "AdamW weight decay.", ge=0)
    grad_clip: float = opt(1.0, "Clip the global gradient norm (0 = off).", ge=0)
    ppo_epochs: int = opt(1, "Passes over each rollout batch.", ge=1)
    mini_batch_size: int = opt(0, "Prompts per optimizer step (0 = data.batch_size).", ge=0)
    micro_batch_size: int = opt(4, "Sequences per worker per forward/backward.", ge=1)
    micro_batch_max_tokens: int = opt(0, "Token budget of one micro-batch per worker in the values and update "
                                         "passes, as actor.micro_batch_max_tokens. 0 = micro_batch_size rows each.",
                                      ge=0)
    ulysses_sequence_parallel_size: int = opt(1, "Ranks that split each sequence (1 = off; docs/parallelism.md).", ge=1)
    value_clip: float = opt(0.5, "Clip value predictions to values +- value_clip.", gt=0)
    pretrain_steps: int = opt(0, "Value pretraining (VAPO; verl's trainer.critic_warmup): the first N steps train only "
                                 "the critic, on the frozen policy's samples; the actor is left as it is.", ge=0)
    loss_agg_mode: str = opt("token-mean", "How token losses are aggregated.", choices=LOSS_AGG_MODES)


SEPARATE_ROLLOUT_MODES = ("one_step_off", "async")   # rollout modes that generate on their own rollout group


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = opt("hf", "Generation engine.", choices=("hf", "vllm", "sglang"))
    mode: str = opt("sync", "\"sync\": generate, then train, on the actor's workers. \"one_step_off\": a separate "
                            "rollout group (resources.rollout_workers) generates batch k+1 with the weights of step "
                            "k-1 while the actor trains on batch k. \"async\": the rollout group generates "
                            "ahead continuously, up to rollout.max_staleness updates stale.",
                    choices=("sync", "one_step_off", "async"))
    max_staleness: int = opt(1, "rollout.mode = \"async\": the most updates a trained token's weights may be older "
                                "than the weights it trains (K).", ge=1)
    staleness_strategy: str = opt("wait", "rollout.mode = \"async\": \"wait\" pauses generation until the trainer "
                                          "catches up; \"drop\" keeps generating and drops groups that got too "
                                          "stale.", choices=("drop", "wait"))
    sync_every: int = opt(1, "rollout.mode = \"async\": push the trained weights to the rollout group every this "
                             "many updates.", ge=1)
    partial_rollout: bool = opt(False, "rollout.mode = \"async\": generate in rounds of rollout.partial_chunk "
                                       "tokens; at a push, unfinished samples keep their tokens and continue on the "
                                       "new weights (every token carries its version). With multi-turn rollouts a "
                                       "round is one turn of each conversation.")
    partial_chunk: int = opt(256, "rollout.partial_rollout: tokens a sample decodes per round; a longer one "
                                  "continues in the next round, after any weight push (not used by multi-turn "
                                  "rollouts, whose rounds are turns).", ge=1)
    n: int = opt(1, "Samples per prompt (group size).", ge=1)
    temperature: float = opt(1.0, "Sampling temperature.", ge=0)
    top_p: float = opt(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = opt(0, "Top-k sampling (0 = off).", ge=0)
    val_temperature: float = opt(0.0, "Validation temperature (0 = greedy).", ge=0)
    val_n: int = opt(1, "Validation samples per prompt.", ge=1)
    gpu_memory_utilization: float = opt(0.5, "vLLM/SGLang: share of GPU memory for the engine.", gt=0, le=1)
    tensor_parallel_size: int = opt(1, "GPUs per vLLM engine in training (consecutive ranks of a node); SGLang: 1.",
                                    ge=1)
    compile: str = opt("off", "hf engine on CPU: decode steps with their per-layer work compiled by torch.compile "
                               "(inductor; seconds to compile once per run, perf/compile_s). \"auto\": for "
                               "generations of at least 128 new tokens on a model of hidden size 512 or more; "
                               "\"on\": always; \"off\": never. Runs eagerly where it cannot run: a GPU, LoRA "
                               "or quantized layers, no C++ compiler.", choices=("auto", "on", "off"))
    enforce_eager: bool = opt(False, "vLLM: no torch.compile / CUDA graphs (starts in seconds instead of ~20 s, "
                                     "generates slower); verl's rollout.enforce_eager.")
    max_logprob_diff: float = opt(0.0, "vLLM/SGLang: stop the run (exit 5) when the engine's log-probs of its own "
                                       "samples differ by more than this, mean nats per token, from the trainer's "
                                       "(rollout/logprob_diff_mean) or, in a separate rollout group, from its rank's "
                                       "float32 copy's (rollout/engine_diff_mean): the weights did not reach the "
                                       "engine. 0 = by "
                                       "model.dtype: 0.001 for float32, 0.05 for bfloat16 / float16 (off with top_p < 1 "
                                       "or top_k > 0).", ge=0)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig,
                                        metadata={"help": "Multi-turn rollouts with tools and interactions."})
    agent: AgentConfig = field(default_factory=AgentConfig,
                               metadata={"help": "Agent programs as the rollout: your code calls the policy through "
                                                 "an OpenAI-compatible endpoint (docs/agents.md)."})


@dataclass(frozen=True)
class OverlongConfig:
    enable: bool = opt(False, "DAPO overlong shaping: penalise responses in the last buffer_len tokens.")
    buffer_len: int = opt(64, "Tokens before max_response_length where the penalty ramps up.", ge=1)
    penalty_factor: float = opt(1.0, "Penalty at max_response_length.", ge=0)


@dataclass(frozen=True)
class RewardConfig:
    function: str = opt("", "Empty = built-in scorer by data_source; or \"file.py:fn\" (verl signature).")
    format_score: float = opt(0.0, "Built-ins: score for a well-formed but wrong answer.")
    timeout_s: float = opt(10.0, "Per-sample timeout.", gt=0)
    on_error: str = opt("fail", "A reward that raises, hangs or returns junk: stop (fail) or score 0 (zero).",
                        choices=("fail", "zero"))
    workers: int = opt(2, "Reward process-pool size.", ge=1)
    sandbox_url: str = opt("", "Built-in code reward: run programs on this SandboxFusion service (http://host:port) "
                               "instead of rlctl's local sandbox.")
    model: str = opt("", "Reward model: a Hugging Face sequence-classification folder or hub id (one score per "
                         "sequence), run on its own workers (placement: resources.colocate).")
    model_micro_batch_size: int = opt(8, "Reward model: sequences per worker per forward pass.", ge=1)
    judge_url: str = opt("", "LLM judge: an OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1).")
    judge_model: str = opt("", "LLM judge: the model name sent in each request.")
    judge_prompt: str = opt(JUDGE_PROMPT, "LLM judge: the user message; {question}, {response} and {ground_truth} "
                                          "are filled in.")
    judge_score: str = opt("last_number", "LLM judge: how to read the score: first_number, last_number, or a "
                                          "regular expression whose first group is the number.")
    judge_max_tokens: int = opt(256, "LLM judge: max_tokens of each answer.", ge=1)
    judge_api_key_env: str = opt("OPENAI_API_KEY", "LLM judge: the environment variable holding the API key "
                                                   "(unset = no key sent).")
    remote_url: str = opt("", "Remote reward service (OpenRLHF protocol): POST {query, prompts, labels} -> "
                              "{rewards}.")
    concurrency: int = opt(8, "Judge / remote service: HTTP requests in flight at once.", ge=1)
    retries: int = opt(2, "Judge / remote service: retries of a failed or timed-out request.", ge=0)
    weights: dict = opt({}, "How sources combine: a weighted sum, e.g. { function = 1.0, judge = 0.1 } "
                            "(a configured source not named weighs 1.0).", choices=REWARD_SOURCES)
    overlong: OverlongConfig = field(default_factory=OverlongConfig, metadata={"help": "DAPO overlong shaping."})


@dataclass(frozen=True)
class SFTConfig:
    prompt_key: str = opt("prompt", "Single-turn data: the prompt column (a string, or a list of chat messages); "
                                    "verl's data.prompt_key.")
    prompt_dict_keys: tuple = opt((), "Keys to descend into a struct prompt column, e.g. [\"question\"] with "
                                      "prompt_key = \"extra_info\" (verl's gsm8k SFT example).")
    response_key: str = opt("response", "Single-turn data: the response column (a string); verl's data.response_key.")
    response_dict_keys: tuple = opt((), "Keys to descend into a struct response column, e.g. [\"answer\"].")
    messages_key: str = opt("messages", "Multi-turn data: the column of chat messages ({role, content} plus "
                                        "assistant tool_calls and tool messages); used when a file has it.")
    tools_key: str = opt("tools", "Multi-turn data: an optional column of tool schemas passed to the chat "
                                  "template (tools=).")
    max_length: int = opt(1024, "Longest sample in tokens after the chat template.", ge=2)
    truncation: str = opt("error", "A sample over max_length: stop with an error, or cut it from the left or right.",
                          choices=("error", "left", "right"))
    assistant_only_loss: bool = opt(True, "Loss on the assistant's tokens only (its content, tool calls and "
                                          "end-of-turn token); false = every token.")
    micro_batch_max_tokens: int = opt(0, "Token budget of one micro-batch per worker (rows x longest row, padding "
                                         "included); samples are grouped by length so short ones share a "
                                         "micro-batch. 0 = actor.micro_batch_size rows each.", ge=0)


DISTILL_LOSSES = ("k1", "k3", "forward_kl_topk", "jsd")   # rlctl.algorithms.distill (a test keeps them equal)


@dataclass(frozen=True)
class DistillConfig:
    teacher: str = opt("", "On-policy distillation: the teacher, a model folder, hub id or run folder with the "
                           "student's tokenizer (empty, with no [distill.teachers] and no teacher_url = off).")
    teachers: dict = opt({}, "Several teachers, name = \"path\", each scoring the rows whose teacher_key value is "
                             "its name (instead of teacher).")
    teacher_key: str = opt("data_source", "The data column (or extra_info key) whose value names a row's teacher "
                                          "in [distill.teachers].")
    teacher_url: str = opt("", "A teacher served over HTTP: an OpenAI-compatible base URL whose /completions "
                               "returns prompt_logprobs (vLLM, `rlctl serve --prompt-logprobs`).")
    teacher_model: str = opt("", "teacher_url: the model name sent in each request.")
    loss: str = opt("k1", "\"k1\": the policy-gradient form (per-token advantage -(log p_student - log p_teacher) "
                          "through actor.policy_loss); supervised losses added to the policy loss: \"k3\" "
                          "(verl's low_var_kl to the teacher), \"forward_kl_topk\" (KL(teacher || student) over "
                          "the teacher's top-k), \"jsd\" (generalised JSD, beta).", choices=DISTILL_LOSSES)
    coef: float = opt(1.0, "Weight of the distillation advantage (k1) or loss (the others).", gt=0)
    topk: int = opt(8, "Teacher tokens per position for forward_kl_topk / jsd and distill/overlap.", ge=1, le=1024)
    beta: float = opt(0.5, "jsd: 0 = KL(teacher || student), 1 = KL(student || teacher), between: the mixture.",
                      ge=0, le=1)
    use_task_reward: bool = opt(False, "Also train on the task reward: its advantages are added to the "
                                       "distillation's (k1) or its policy loss to the distillation loss.")


def distill_enabled(config) -> bool:
    d = config.distill
    return bool(d.teacher or d.teachers or d.teacher_url)


def teacher_paths(config) -> dict[str, str]:
    """name -> path of the teachers the workers load (distill.teacher is named "teacher")."""
    d = config.distill
    return dict(d.teachers) or ({"teacher": d.teacher} if d.teacher else {})


@dataclass(frozen=True)
class ResourcesConfig:
    address: str = opt("", "Ray address: empty = embedded Ray; 'auto' or 'ray://host:port' joins a cluster.")
    nodes: int = opt(1, "Nodes to spread workers over.", ge=1)
    gpus_per_node: int | str = opt("auto", "GPUs per node; \"auto\" = every GPU this machine sees (0 on a CPU "
                                           "machine), 0 = CPU training.", ge=0, int_or_auto=True)
    workers: int = opt(1, "Data-parallel workers per role.", ge=1)
    cpus_per_worker: int = opt(1, "CPU cores per worker (torch threads).", ge=1)
    colocate: bool = opt(True, "Critic shares the actor's workers (else its own group).")
    rollout_workers: int = opt(1, "rollout.mode = \"one_step_off\" or \"async\": ranks of the separate rollout "
                                  "group, each cpus_per_worker CPUs (on GPUs also one GPU of the node, the actor "
                                  "getting the other gpus_per_node - rollout_workers) and a full copy of the policy.",
                               ge=1)


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)


def iter_keys(cls=Config, prefix: str = ""):
    """Yield (dotted_key, dataclass_field) for every leaf key of the schema."""
    for f in fields(cls):
        if is_dataclass(f.type) or (isinstance(f.default_factory, type) and is_dataclass(f.default_factory)):
            yield from iter_keys(f.default_factory, prefix + f.name + ".")
        else:
            yield prefix + f.name, f


def rollout_is_level(config: Config) -> str:
    """algorithm.rollout_correction.rollout_is with "auto" resolved: off ("") in sync mode, verl's
    RolloutCorrectionConfig default ("sequence") when a stale policy generates (one_step_off, async)."""
    level = config.algorithm.rollout_correction.rollout_is
    if level != "auto":
        return level
    return "sequence" if config.rollout.mode in SEPARATE_ROLLOUT_MODES else ""
