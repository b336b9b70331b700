"""MLPerf Training Llama 3.1 8B pretraining (training 6.0.0's small LLM), registered as workload ``llama31_8b`` of
the training suite: Megatron indexed datasets and GPT samples (``indexed.py``, ``gpt.py``), a synthetic Markov
corpus of known entropy (``synth.py``), the Llama 3.1 model (``model.py``), FSDP2 + tensor parallelism
(``parallelize.py``) and the workload on the shared harness (``workload.py``). See docs/llama31_8b.md.
"""
from hpcbench.common.benchmark import Benchmark, ClosedDefinition, HyperparameterKeys, Target, upper_bound_only

BENCHMARK = Benchmark(
    name="llama31_8b", benchmark="llama31_8b", suite="training", ruleset="6.0.0",
    # closed_llama31_8b.yaml: "(v['value'] <= 3.3) and v['value'] > 0.0" - a log perplexity, lower is better
    target=Target("eval_accuracy", 0.0, 3.3, False, True, lower_is_better=True),
    open_target=upper_bound_only("eval_accuracy", 1.0, inclusive=False, lower_is_better=True),  # "v['value'] < 1.0"
    higher_is_better=False, required_runs=10, epoch_reporting="samples",
    # the reference (small_llm_pretraining/nemo/pretrain_llama31.py): --eval_every 12288 training sequences (every
    # config_*.sh: EVAL_EVERY=12288), evaluated every ceil(eval_every / gbs) steps (MLPerfCallback's eval_every)
    samples_cadence="steps",
    # the reference evaluates on that cadence only (MLPerfCallback): a closed run adds no evaluation at its end
    closed_cadence_only=True,
    summary="Llama 3.1 8B pretraining on Megatron indexed datasets (C4), FSDP2 + tensor parallel; eval log perplexity",
    layout="dataset", workload="workload:LlamaWorkload", datagen="synth:LlamaDatagen",
    keys=HyperparameterKeys({"adamw": (
        "opt_name", "opt_base_learning_rate", "opt_end_learning_rate", "opt_learning_rate_warmup_steps",
        "opt_learning_rate_decay_steps", "opt_learning_rate_decay_schedule", "opt_adamw_beta_1", "opt_adamw_beta_2",
        "opt_adamw_epsilon", "opt_adamw_weight_decay", "opt_gradient_clip_norm")}, names={"adamw": "adamw"}),
    closed=ClosedDefinition(
        parameters=(8_030_261_248,), eval_samples=1024,
        fixed={"max_sequence_length": 8192, "opt_name": "adamw", "opt_adamw_beta_1": 0.9, "opt_adamw_beta_2": 0.95,
               "opt_adamw_epsilon": 1e-5, "opt_adamw_weight_decay": 0.1, "opt_gradient_clip_norm": 1.0,
               "opt_learning_rate_decay_schedule": "cosine with linear warmup", "max_steps": 1_200_000},
        source="training 6.0.0 closed_llama31_8b.yaml (sequence 8192, AdamW 0.9/0.95/1e-5/0.1, clip 1.0, cosine with "
               "linear warmup, max_steps 1,200,000, 1,024 evaluation samples); Llama 3.1 8B: 8,030,261,248 parameters"),
)
