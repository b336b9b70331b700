"""MLPerf Training BERT-large, registered as workload ``bert`` of the training suite (ruleset training
5.0.0): the NVIDIA-style HDF5 format (padded and packed), a synthetic language, the model with packed
sequences, masked-LM accuracy, and the workload on the shared harness (``workload.py``).
See docs/bert.md.
"""
from hpcbench.common.benchmark import Benchmark, ClosedDefinition, HyperparameterKeys, Target, upper_bound_only

# training 5.0.0: 5.1.0 still ships closed_bert.yaml but its common rules no longer accept bert as a
# submission_benchmark (see workload.py); 5.0.0 is the newest that does
BENCHMARK = Benchmark(
    name="bert", benchmark="bert", suite="training", ruleset="5.0.0",
    target=Target("eval_accuracy", 0.720, 1.0, True, False),  # (v['value'] >= 0.720) and v['value'] < 1.0
    open_target=upper_bound_only("eval_accuracy", 1.0, inclusive=False),
    higher_is_better=True, required_runs=10, epoch_reporting="samples",
    summary="BERT-large masked-LM + next-sentence pretraining on packed HDF5 shards; masked-LM accuracy",
    layout="dataset", workload="workload:BertWorkload", datagen="synth:BertDatagen", converter="convert:convert",
    # closed_bert.yaml pins the opt_lamb_* keys; the rules' table names the epsilon opt_epsilon (NVIDIA logs both)
    keys=HyperparameterKeys({"lamb": (
        "opt_name", "opt_base_learning_rate", "opt_lamb_epsilon", "opt_epsilon", "opt_lamb_beta_1", "opt_lamb_beta_2",
        "opt_lamb_weight_decay_rate", "opt_learning_rate_training_steps", "opt_learning_rate_warmup_steps",
        "num_warmup_steps", "start_warmup_step", "opt_lamb_learning_rate_decay_poly_power")}),
    # train_samples is not pinned: submitters' logs (NVIDIA's) state the samples a run trained there
    closed=ClosedDefinition(
        parameters=(336_232_258, 336_226_108), eval_samples=10_000,
        fixed={"opt_name": "lamb", "max_sequence_length": 512},
        source="training_rules.adoc (bert: lamb; the 10,000-sample evaluation set); BERT-large at 512 tokens: "
               "336,226,108 parameters with the 30,522-token vocabulary, 336,232,258 padded to 30,528 as NVIDIA's"),
)
